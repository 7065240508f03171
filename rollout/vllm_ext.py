"""A vLLM worker extension that loads new weights in place, inside the engine's worker process.

vLLM mixes this class into its worker (`worker_extension_cls`); the engine
calls it through `collective_rpc`. Weights arrive as safetensors-serialised
bytes, because tensors passed as RPC arguments arrive as plain lists in
vLLM's multiprocess mode. Imports stay inside the method: this module is
imported by vLLM's worker process, which may not have our packages' deps
loaded yet.
"""

from __future__ import annotations


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
        runner.reload_weights(weights_iterator=tensors())
        model = runner.get_model()
        # The CPU backend repacks the lm_head for its GEMM at load time. With tied
        # embeddings the reload writes the shared weight through embed_tokens, so
        # the packed lm_head goes stale (logits off by ~3): repack it here.
        lm_head = getattr(model, "lm_head", None)
        method = getattr(lm_head, "quant_method", None)
        if lm_head is not None and method is not None and getattr(model.config, "tie_word_embeddings", False):
            method.process_weights_after_loading(lm_head)
        return n
