"""A vLLM worker extension that loads new weights in place, inside the engine's worker process.

vLLM mixes this class into its worker (`worker_extension_cls`); the engine
calls it through `collective_rpc`. Weights arrive as safetensors-serialised
bytes, because tensors passed as RPC arguments arrive as plain lists in
vLLM's multiprocess mode. Imports stay inside the method: this module is
imported by vLLM's worker process, which may not have our packages' deps
loaded yet (rollout.lora_cpu needs only torch and vLLM).
"""

from __future__ import annotations

from rollout import lora_cpu

# this module is imported in the engine's worker process before its first forward: the CPU
# backend's LoRA ops are replaced there (rollout/lora_cpu.py says why; the GPU path does not use them)
lora_cpu.install()


def _quiet_expected_reload_warnings(tied: bool):
    """vLLM's layerwise reload warns "<Layer>: Failed to load weights" for layers a weight
    update legitimately leaves out: the rotary embedding (a cache, not a weight) and, with tied
    embeddings, the lm_head (written through embed_tokens, repacked below). Filter exactly
    those, every reload, so real failures stay visible."""
    import logging

    expected = {"RotaryEmbedding"} | ({"ParallelLMHead"} if tied else set())

    class Expected(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            layer, _, rest = record.getMessage().partition(": ")
            return not (rest == "Failed to load weights" and layer in expected)

    log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    f = Expected()
    log.addFilter(f)
    return lambda: log.removeFilter(f)


class WeightSyncExtension:
    def tracerl_load_weights(self, buckets: list[bytes]) -> int:
        """Load full or partial weights from safetensors buckets; returns tensors loaded."""
        from safetensors.torch import load

        n = 0

        def tensors():
            nonlocal n
            for blob in buckets:
                for item in load(blob).items():
                    n += 1
                    yield item

        runner = self.model_runner
        model = runner.get_model()
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        restore = _quiet_expected_reload_warnings(tied)
        try:
            runner.reload_weights(weights_iterator=tensors())
        finally:
            restore()
        model = runner.get_model()
        # The CPU backend repacks the lm_head for its GEMM at load time. With tied
        # embeddings the reload writes the shared weight through embed_tokens, so
        # the packed lm_head goes stale (logits off by ~3): repack it here.
        lm_head = getattr(model, "lm_head", None)
        method = getattr(lm_head, "quant_method", None)
        if lm_head is not None and method is not None and tied:
            method.process_weights_after_loading(lm_head)
        return n
