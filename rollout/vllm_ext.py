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

        return self._tracerl_reload(item for blob in buckets for item in load(blob).items())

    def tracerl_open_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str,
                                  timeout_s: float) -> None:
        """Join the policy's weight group (rollout/weight_transport.py) as `rank` + this worker's
        tensor-parallel rank (each worker of an engine receives the full weights)."""
        from rollout.weight_transport import open_group

        self._tracerl_group = None  # a group opened before (the engine's last) is dropped
        self._tracerl_group = open_group(host, port, rank + getattr(self, "rank", 0), world_size, backend,
                                         timeout_s)

    def tracerl_receive_weights(self, layout: list) -> tuple[int, float]:
        """Receive the weights in `layout` order from the learner's rank 0 (one bucket at a time,
        so at most a bucket is held beside the model) and load them in place; returns the tensors
        loaded and the seconds spent receiving (the rest is vLLM's load)."""
        import time

        import torch

        from rollout.weight_transport import broadcast, dtype_of, wait

        device = getattr(self, "device", None) or torch.device("cpu")
        receive_s = 0.0

        def start(bucket):
            received = [torch.empty(shape, dtype=dtype_of(dtype), device=device) for _, shape, dtype in bucket]
            return received, broadcast(self._tracerl_group, received)

        def tensors():
            # the next bucket arrives while vLLM loads and repacks this one
            nonlocal receive_s
            pending = start(layout[0]) if layout else None
            for k, bucket in enumerate(layout):
                t0 = time.perf_counter()
                received, works = pending
                wait(works)
                pending = start(layout[k + 1]) if k + 1 < len(layout) else None
                receive_s += time.perf_counter() - t0
                yield from zip((name for name, _, _ in bucket), received)

        return self._tracerl_reload(tensors()), receive_s

    def _tracerl_reload(self, weights) -> int:
        """vLLM's in-place reload of `weights` ((HF name, tensor) pairs): only the layers they
        touch are re-processed (on CPU: their GEMM weights repacked)."""
        n = 0

        def counted():
            nonlocal n
            for item in weights:
                n += 1
                yield item

        runner = self.model_runner
        model = runner.get_model()
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        restore = _quiet_expected_reload_warnings(tied)
        try:
            runner.reload_weights(weights_iterator=counted())
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
