"""Learner: one DeepSpeed rank (a Ray actor). gloo on CPU, NCCL on GPU; ZeRO 0-3; fp32 or bf16.

Driven by trainer/learner_group.py, which starts `world_size` of these, calls
`setup` on all of them at once (DeepSpeed's rendezvous needs every rank), and
broadcasts every collective call (`train_step`, `export_weights`, `save`,
`load`, `logprobs`) to all ranks.

The loss of a micro-batch is a weighted SUM whose weights already carry the
batch-level normalisation (trainer/packing.py), so the update must apply
sum-over-ranks-and-micro-batches of the gradients. DeepSpeed averages over
ranks and (optionally) divides by the accumulation steps; `train_step` undoes
both explicitly.

With `lora` a rank holds the base model frozen and trains one PEFT LoRA adapter on
it: only the adapter's parameters have gradients and optimizer state, and
`export_weights` sends only them (PEFT's saved names, see rollout/lora.py).
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field
from enum import StrEnum

from trainer.losses import LossConfig, microbatch_loss
from trainer.packing import MicroBatch


class Optimizer(StrEnum):
    adamw = "adamw"
    sgd = "sgd"


@dataclass
class LearnerConfig:
    world_size: int = 2  # DeepSpeed ranks (Ray actors)
    num_cpus: float = 1.0  # Ray CPUs per rank
    num_gpus: float = 0.0  # Ray GPUs per rank (1 on GPU machines)
    torch_threads: int = 0  # CPU: intra-op threads per rank (0: Ray's default, num_cpus)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources (node placement)
    zero_stage: int = 2  # DeepSpeed ZeRO stage 0-3
    optimizer: Optimizer = Optimizer.adamw  # a torch optimizer (DeepSpeed's own would g++-build ops)
    lr: float = 1e-5  # peak learning rate
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    grad_clip: float = 1.0  # max global grad norm (0 disables)
    micro_batch_tokens: int = 4096  # padded tokens per forward/backward
    gradient_checkpointing: bool = False  # trade compute for activation memory
    dist_timeout_s: float = 600.0  # collective-op timeout
    call_timeout_s: float = 1800.0  # one learner call (train step, weight export, save, load) longer than this stops the run


def _grad_norm(module) -> float:
    import torch

    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Learner:
    def __init__(self, rank: int, model_path: str, cfg: LearnerConfig, loss: LossConfig,
                 dtype: str = "float32", seed: int = 0, lora=None):
        """`dtype`: the model's (`model.dtype`): float32, or bfloat16 with fp32 master weights;
        `lora`: a rollout.config.LoraConfig to train an adapter on the frozen model instead."""
        self.rank, self.model_path, self.cfg, self.loss_cfg = rank, model_path, cfg, loss
        self.lora = lora
        self.dtype, self.seed = dtype, seed
        self.step = 0
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient
        self.engine = None

    def master_address(self) -> tuple[str, int]:
        """Where rank 0 listens for the rendezvous (call on rank 0 before `setup`)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> dict:
        """Join the process group and build the DeepSpeed engine; all ranks must call it at once."""
        import datetime

        import deepspeed
        import torch
        from transformers import AutoModelForCausalLM

        cfg = self.cfg
        on_gpu = cfg.num_gpus > 0
        os.environ.update(RANK=str(self.rank), LOCAL_RANK="0" if on_gpu else str(self.rank),
                          WORLD_SIZE=str(cfg.world_size), LOCAL_WORLD_SIZE=str(cfg.world_size),
                          MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        if not on_gpu:
            # DeepSpeed g++-builds a shared-memory all-reduce op (~70 s) when its torch comm
            # backend starts; it is only an inference fast path. Skip it on CPU.
            import deepspeed.comm.torch as ds_torch_comm

            ds_torch_comm.build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo",
                                   timeout=datetime.timedelta(seconds=cfg.dist_timeout_s))
        torch.manual_seed(self.seed)
        if cfg.torch_threads > 0:
            torch.set_num_threads(cfg.torch_threads)
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        dtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if self.lora is not None:
            from peft import get_peft_model

            from rollout.lora import peft_config

            # the same seed on every rank: the same lora_A init (lora_B starts at 0)
            model = get_peft_model(model, peft_config(self.lora, self.model_path))
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if self.lora is not None:  # the frozen embeddings' output must carry grad into the blocks
                model.enable_input_require_grads()
        self.ref_model = None
        if self.loss_cfg.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval()
            self.ref_model.requires_grad_(False)
        # A torch optimizer, not a DeepSpeed-named one: those g++-build fused ops on first use.
        trained = [p for p in model.parameters() if p.requires_grad]  # with LoRA: the adapter's only
        if cfg.optimizer == "adamw":
            opt = torch.optim.AdamW(trained, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        else:
            opt = torch.optim.SGD(trained, lr=cfg.lr, weight_decay=cfg.weight_decay)
        warmup = max(cfg.warmup_steps, 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # one packed MicroBatch per micro step
            "gradient_accumulation_steps": 1,  # reset per step from the shard size
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "zero_allow_untested_optimizer": True,  # torch SGD (AdamW is on the tested list)
            "bf16": {"enabled": self.dtype == "bfloat16", "check_grad_overflow": True},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=trained, optimizer=opt, lr_scheduler=sched, config=ds_config)
        import ray

        return {"rank": self.rank, "params": sum(p.numel() for p in model.parameters()),
                "trained_params": sum(p.numel() for p in trained),
                "node_id": ray.get_runtime_context().get_node_id()}

    # ---------------------------------------------------------------- train
    def train_step(self, shard: list[MicroBatch]) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches (every rank has the same count)."""
        t0 = time.perf_counter()
        eng = self.engine
        eng.set_train_batch_size(len(shard) * self.cfg.world_size)
        sums: dict[str, float] = {}
        loss_total = 0.0
        own_norm = None
        skipped_before, own_skip = eng.skipped_steps, False
        for i, mb in enumerate(shard):
            loss, metrics = microbatch_loss(eng, mb, self.loss_cfg, self.ref_model, self.device)
            # DeepSpeed averages gradients over ranks: scale back to a sum; no division by GAS.
            eng.backward(loss * self.cfg.world_size, scale_wrt_gas=False)
            if i == len(shard) - 1 and self.cfg.zero_stage == 0 and self.dtype != "bfloat16":
                # ZeRO-0 fp32 neither records the norm nor skips a non-finite step (every other
                # ZeRO stage and bf16 skip it themselves). The gradients are all-reduced by now,
                # so every rank sees the same norm and takes the same decision.
                own_norm = _grad_norm(eng.module)
                own_skip = not math.isfinite(own_norm)
            if own_skip:
                self._skip_optimizer_step()
            else:
                eng.step()
            loss_total += loss.item()
            for k, v in metrics.items():
                sums[k] = max(sums.get(k, 0.0), v.item()) if k == "ratio_max" else sums.get(k, 0.0) + v.item()
        self.step += 1
        skipped = own_skip or eng.skipped_steps > skipped_before
        self.skipped_steps += skipped
        grad_norm = eng.get_global_grad_norm()
        grad_norm = grad_norm if grad_norm is not None else own_norm
        out = {"loss": loss_total, "grad_norm": float(grad_norm) if grad_norm is not None else 0.0,
               "lr": self.scheduler.get_last_lr()[0], "step": self.step,
               "skipped": float(skipped), "skipped_steps": float(self.skipped_steps),
               "tokens": sums.pop("tokens", 0.0), "padded_tokens": float(sum(m.input_ids.size for m in shard)),
               "seconds": time.perf_counter() - t0}
        out.update(sums)
        return out

    def _skip_optimizer_step(self) -> None:
        """Close the step through DeepSpeed (its micro-step and boundary counts move on) without
        an optimizer step: the weights, the optimizer state and the lr schedule stay untouched.
        The non-finite gradients are zeroed first (gradient clipping still runs on them)."""
        opt = self.engine.optimizer
        sched, lrs = self.scheduler.state_dict(), [g["lr"] for g in opt.param_groups]
        for p in self.engine.module.parameters():
            if p.grad is not None:
                p.grad.zero_()
        opt.step = lambda *args, **kwargs: None  # this once; the class's step is back below
        try:
            self.engine.step()
        finally:
            del opt.step
        self.scheduler.load_state_dict(sched)
        for g, lr in zip(opt.param_groups, lrs):
            g["lr"] = lr

    def logprobs(self, input_ids: list[int], start: int) -> list[float]:
        """Learner log-probs of input_ids[start:] at the current weights (collective under ZeRO-3)."""
        import torch

        from trainer.losses import token_logprobs

        ids = torch.tensor([input_ids], device=self.device)
        with torch.no_grad():
            logits = self.engine(input_ids=ids).logits
        return token_logprobs(logits, ids, self.loss_cfg.temperature)[0, start:].float().tolist()

    # ------------------------------------------------------- weights & state
    def export_weights(self, bucket_bytes: int = 64 << 20) -> list[bytes] | None:
        """Full fp32 weights (with LoRA: the adapter's only, under PEFT's saved names) as
        safetensors buckets on rank 0 (None elsewhere); collective."""
        import deepspeed
        import torch
        from safetensors.torch import save

        from rollout.lora import saved_name

        module = self.engine.module
        buckets, current, size = [], {}, 0
        for name, p in module.named_parameters():
            if self.lora is not None and not p.requires_grad:
                continue
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None, enabled=self.cfg.zero_stage == 3):
                if self.rank == 0:
                    t = p.detach().to("cpu", torch.float32).clone()
                    current[saved_name(name) if self.lora is not None else name] = t
                    size += t.numel() * 4
            if self.rank == 0 and size >= bucket_bytes:
                buckets.append(save(current))
                current, size = {}, 0
        if self.rank == 0 and current:
            buckets.append(save(current))
        return buckets if self.rank == 0 else None

    def save(self, path: str) -> None:
        """DeepSpeed state (model, optimizer, scheduler) + step; collective."""
        # With LoRA the frozen base is left out: it is the model the run started from.
        self.engine.save_checkpoint(path, tag="state", client_state={"step": self.step},
                                    exclude_frozen_parameters=self.lora is not None)

    def load(self, path: str) -> int:
        """Restore what `save` wrote; returns the step. Collective."""
        _, client = self.engine.load_checkpoint(path, tag="state", load_optimizer_states=True,
                                                load_lr_scheduler_states=True, load_module_strict=self.lora is None)
        self.step = int(client["step"])
        return self.step

    def rss(self) -> int:
        """This rank's resident memory, bytes."""
        import psutil

        return psutil.Process().memory_info().rss

    def base_digest(self) -> str:
        """A hash of the weights that are not trained, under the base model's own names (with
        LoRA: the frozen base, which must never change); gathered under ZeRO-3."""
        import hashlib

        import deepspeed

        frozen = {n.removeprefix("base_model.model.").replace(".base_layer.", "."): p
                  for n, p in self.engine.module.named_parameters() if not p.requires_grad}
        h = hashlib.sha256()
        for name, p in sorted(frozen.items()):
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None, enabled=self.cfg.zero_stage == 3):
                h.update(name.encode())
                h.update(p.detach().cpu().float().numpy().tobytes())
        return h.hexdigest()

    def param_digest(self) -> str:
        """A hash of this rank's full parameters (gathered under ZeRO-3), to compare ranks."""
        import hashlib

        import deepspeed

        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([p], modifier_rank=None, enabled=self.cfg.zero_stage == 3):
                h.update(p.detach().cpu().float().numpy().tobytes())
        return h.hexdigest()

