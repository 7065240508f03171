"""A vLLM worker extension that loads new weights in place, inside the engine's worker process.

vLLM mixes this class into its worker (`worker_extension_cls`); the engine
calls it through `collective_rpc`. Weights arrive as safetensors-serialised
bytes, because tensors passed as RPC arguments arrive as plain lists in
vLLM's multiprocess mode. Imports stay inside the method: this module is
imported by vLLM's worker process, which may not have our packages' deps
loaded yet (rollout.engine.lora_ops needs only torch and vLLM).
"""

from __future__ import annotations

from vllm.platforms import current_platform

from rollout.engine import lora_ops

# this module is imported in the engine's worker process before its first forward: the CPU
# backend's LoRA ops are replaced there (rollout/engine/lora_ops.py says why; CUDA has its own kernels)
if current_platform.is_cpu():
    lora_ops.install()


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

    def _tracerl_device(self):
        import torch

        return getattr(self, "device", None) or torch.device("cpu")

    def tracerl_device_identity(self) -> str:
        """This worker's device, for the transport learner rank 0 sends it weights over."""
        from rollout.engine.weight_group import device_identity

        return device_identity(self._tracerl_device())

    def tracerl_open_weight_group(self, plan: bytes, first_member: int, timeout_s: float) -> str:
        """Join the policy's weight group (rollout/engine/weight_group.py) as member `first_member` + this
        worker's tensor-parallel rank (each worker of an engine receives the full weights); returns
        the transport the plan (pickled by our Engine actor) gives it."""
        import pickle

        from rollout.engine.weight_group import WeightGroup

        plan = pickle.loads(plan)
        old, self._tracerl_group = getattr(self, "_tracerl_group", None), None
        if old is not None:  # a group opened before (the engine's last) is dropped
            old.close()
        member = first_member + getattr(self, "rank", 0)
        self._tracerl_group = WeightGroup(plan, member, self._tracerl_device(), timeout_s)
        return self._tracerl_group.transport

    def tracerl_receive_weights(self, version: int, layout: list) -> tuple[int, float]:
        """Receive `version`'s weights in `layout` order from learner rank 0 (one bucket at a time,
        so at most a bucket is held beside the model) and load them in place; returns the tensors
        loaded and the seconds spent receiving (the rest is vLLM's load)."""
        import time

        receive_s = 0.0

        def timed(items):
            nonlocal receive_s
            while True:
                t0 = time.perf_counter()
                item = next(items, None)
                receive_s += time.perf_counter() - t0
                if item is None:
                    return
                yield item

        return self._tracerl_reload(timed(self._tracerl_group.receive(version, layout))), receive_s

    def _tracerl_reload(self, weights) -> int:
        """vLLM's in-place reload of `weights` ((HF name, tensor) pairs): only the layers they
        touch are re-processed (on CPU: their GEMM weights repacked)."""
        n = 0

        def counted():
            nonlocal n
            for item in weights:
                n += 1
                yield item

        model = self.model_runner.get_model()
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        restore = _quiet_expected_reload_warnings(tied)
        try:  # the worker's own reload: under its vLLM config, as some layers' loaders need
            self.reload_weights(weights_iterator=counted())
        finally:
            restore()
        model = self.model_runner.get_model()
        # The CPU backend repacks the lm_head for its GEMM at load time. With tied
        # embeddings the reload writes the shared weight through embed_tokens, so
        # the packed lm_head goes stale (logits off by ~3): repack it here.
        lm_head = getattr(model, "lm_head", None)
        method = getattr(lm_head, "quant_method", None)
        if lm_head is not None and method is not None and tied:
            method.process_weights_after_loading(lm_head)
        return n
