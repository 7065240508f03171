"""Learner: one DeepSpeed rank (a Ray actor). gloo on CPU, NCCL on GPU; ZeRO 0-3; fp32 or bf16.

Driven by trainer/learner_group.py, which starts `world_size` of these, calls
`setup` on all of them at once (DeepSpeed's rendezvous needs every rank), and
broadcasts every collective call (`train_step`, `export_weights`, `write_hf`,
`broadcast_weights`, `save`, `load`, `logprobs`) to all ranks. Rank 0 alone
hosts the weight group to the engines (rollout/engine/weight_group.py).

The loss of a micro-batch is a weighted SUM whose weights already carry the
batch-level normalisation (trainer/packing.py), so the update must apply
sum-over-ranks-and-micro-batches of the gradients. DeepSpeed averages over
ranks and (optionally) divides by the accumulation steps; `train_step` undoes
both explicitly.

With `adapters` a rank holds the base model once, frozen, and trains one PEFT LoRA
adapter per adapter policy on it, each with its own DeepSpeed engine over the
shared module: its own optimizer (state, lr, schedule, clipping) over its own
adapter's parameters. Every per-policy call names its adapter, which becomes
PEFT's active one and the only parameters with requires_grad, so a step of one
adapter neither reads nor moves the others (ZeRO 0-2; ZeRO-3 partitions the
module itself, so there each adapter needs its own ranks). `export_weights`
sends only the adapter's tensors (PEFT's saved names, see rollout/engine/lora_names.py).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from rollout.engine.lora_names import own_params, peft_config, peft_name, saved_name
from rollout.engine.weight_group import Layout
from rollout.log import setup_logging
from trainer.config import LearnerConfig, LossConfig
from trainer.gather import digest, gathered
from trainer.losses import microbatch_loss
from trainer.packing import MicroBatch
from trainer.rank_env import free_port, gpu_memory_share, quiet_start, skip_shm_comm_build


def _grad_norm(params) -> float:
    import torch

    norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


@dataclass
class _Slot:
    """One trained set of parameters on a rank (the full model, or one adapter) and its DeepSpeed
    engine: the optimizer, the lr schedule and the step counts that go with it."""

    engine: Any
    scheduler: Any
    params: list  # the parameters it trains
    names: list[str]  # and their module names
    step: int = 0
    skipped_steps: int = 0  # optimizer steps skipped for a non-finite loss or gradient


class Learner:
    def __init__(
        self,
        rank: int,
        model_path: str,
        cfg: LearnerConfig,
        loss: LossConfig,
        dtype: str = "float32",
        seed: int = 0,
        adapters: dict | None = None,
    ):
        """`dtype`: the model's (`model.dtype`): float32, or bfloat16 with fp32 master weights;
        `adapters`: {policy: (rollout.config.LoraConfig, LearnerConfig)}: train those LoRA adapters
        on the frozen model instead, each with its own optimizer settings (lr, betas, ...)."""
        setup_logging()  # this actor's process
        self.rank, self.model_path, self.cfg, self.loss_cfg = rank, model_path, cfg, loss
        self.adapters = dict(adapters or {})
        self.dtype, self.seed = dtype, seed
        self.slots: dict[str | None, _Slot] = {}  # adapter policy (None: the full model) -> its slot
        self.module = None
        self.weight_group = None  # rank 0: its end of the weight group to the engines (CollectiveSync)
        self._pending_group = None  # rank 0: (plan, staging buffers, timeout) between prepare and open

    def master_address(self) -> tuple[str, int]:
        """Where rank 0 listens for the rendezvous (call on rank 0 before `setup`)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master: tuple[str, int]) -> dict:
        """Join the process group at rank 0's `master_address()` and build the DeepSpeed engine(s);
        all ranks must call it at once."""
        self._join(master)
        import ray
        import torch
        from transformers import AutoModelForCausalLM

        self.module = model = self._load_model()
        self.ref_model = None
        if self.loss_cfg.kl_coef > 0:
            dtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval()
            self.ref_model.requires_grad_(False)
        if not self.adapters:
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            self.slots[None] = self._slot(model, named, self.cfg)
        for name, (_, opt_cfg) in self.adapters.items():
            named = [(n, p) for n, p in model.named_parameters() if own_params(name).search(n)]
            self.slots[name] = self._slot(model, named, opt_cfg, name)
        self.activate(next(iter(self.slots)))
        return {
            "rank": self.rank,
            "params": sum(p.numel() for p in model.parameters()),
            "trained_params": sum(p.numel() for s in self.slots.values() for p in s.params),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def _join(self, master: tuple[str, int]) -> None:
        """This rank in the process group (nccl on GPUs, gloo on CPUs), seeded, on its device."""
        import datetime

        cfg, (master_addr, master_port) = self.cfg, master
        on_gpu = cfg.num_gpus > 0
        quiet_start(on_gpu)
        import deepspeed
        import torch

        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK="0" if on_gpu else str(self.rank),
            WORLD_SIZE=str(cfg.world_size),
            LOCAL_WORLD_SIZE=str(cfg.world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        if not on_gpu:
            skip_shm_comm_build()
        deepspeed.init_distributed(
            dist_backend="nccl" if on_gpu else "gloo", timeout=datetime.timedelta(seconds=cfg.dist_timeout_s)
        )
        torch.manual_seed(self.seed)
        if cfg.torch_threads > 0:
            torch.set_num_threads(cfg.torch_threads)
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        share = gpu_memory_share(cfg)
        if share is not None and self.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(share, self.device)

    def _load_model(self):
        """The model in float32 with this learner's LoRA adapters on it (if it trains adapters), and
        gradient checkpointing if asked."""
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if self.adapters:
            from peft import get_peft_model

            if self.cfg.zero_stage == 3 and len(self.adapters) > 1:
                raise ValueError(
                    "ZeRO-3 partitions the model itself: adapters on one base cannot share its "
                    "ranks; give each adapter policy its own learner group"
                )
            for i, (name, (lora, _)) in enumerate(self.adapters.items()):
                torch.manual_seed(self.seed)  # every adapter's lora_A as if it were alone (lora_B starts at 0)
                if i == 0:
                    model = get_peft_model(model, peft_config(lora, self.model_path), adapter_name=peft_name(name))
                else:
                    model.add_adapter(peft_name(name), peft_config(lora, self.model_path))
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if self.adapters:  # the frozen embeddings' output must carry grad into the blocks
                model.enable_input_require_grads()
        return model

    def _slot(self, model, named: list, opt_cfg: LearnerConfig, adapter: str | None = None) -> _Slot:
        """A DeepSpeed engine over `model` that trains the `named` parameters only, with `opt_cfg`'s
        optimizer settings (a torch optimizer: DeepSpeed's own g++-build fused ops on first use)."""
        import deepspeed
        import torch

        slot = _Slot(None, None, [p for _, p in named], [n for n, _ in named])
        if adapter is not None:
            self.slots[adapter] = slot
            self.activate(adapter)  # ZeRO takes only parameters that require grad
        if opt_cfg.optimizer == "adamw":
            opt = torch.optim.AdamW(
                slot.params, lr=opt_cfg.lr, betas=tuple(opt_cfg.betas), weight_decay=opt_cfg.weight_decay
            )
        else:
            opt = torch.optim.SGD(slot.params, lr=opt_cfg.lr, weight_decay=opt_cfg.weight_decay)
        warmup = max(opt_cfg.warmup_steps, 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # one packed MicroBatch per micro step
            "gradient_accumulation_steps": 1,  # reset per step from the shard size
            "gradient_clipping": opt_cfg.grad_clip,
            "zero_optimization": {"stage": self.cfg.zero_stage},
            "zero_allow_untested_optimizer": True,  # torch SGD (AdamW is on the tested list)
            "bf16": {"enabled": self.dtype == "bfloat16", "check_grad_overflow": True},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        slot.engine, _, _, slot.scheduler = deepspeed.initialize(
            model=model, model_parameters=slot.params, optimizer=opt, lr_scheduler=sched, config=ds_config
        )
        if self.cfg.world_size == 1 and self.cfg.zero_stage == 0 and self.dtype != "bfloat16":
            # One rank: the all-reduce after backward only copies every gradient into buckets and
            # back (~0.25 s of an 8 s SmolLM2 step); the sum over one rank is the gradient itself.
            slot.engine.enable_backward_allreduce = False
        return slot

    def activate(self, adapter: str | None) -> _Slot:
        """The slot of `adapter` (None: the full model), made the one that runs and trains: PEFT's
        active adapter, and the only adapter whose parameters require grad."""
        if adapter not in self.slots:
            raise KeyError(f"this learner trains {sorted(map(str, self.slots))}, not {adapter!r}")
        if adapter is not None:
            self.module.set_adapter(peft_name(adapter))
            for name, slot in self.slots.items():
                for p in slot.params:
                    p.requires_grad_(name == adapter)
        return self.slots[adapter]

    # ---------------------------------------------------------------- train
    def train_step(self, shard: list[MicroBatch], adapter: str | None = None) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches (every rank has the same count), of
        the full model or of `adapter`."""
        t0 = time.perf_counter()
        slot = self.activate(adapter)
        eng = slot.engine
        eng.set_train_batch_size(len(shard) * self.cfg.world_size)
        sums: dict[str, float] = {}
        loss_total = 0.0
        own_norm = None
        skipped_before, own_skip = eng.skipped_steps, False
        for i, mb in enumerate(shard):
            # The optimizer steps after this shard's last micro-batch, never inside it: DeepSpeed's own
            # boundary counts micro-steps over the whole run, so it misplaces the boundary once the
            # number of micro-batches per step changes (every run's does).
            eng.set_gradient_accumulation_boundary(i == len(shard) - 1)
            loss, metrics = microbatch_loss(eng, mb, self.loss_cfg, self.ref_model, self.device)
            # DeepSpeed averages gradients over ranks: scale back to a sum; no division by GAS.
            eng.backward(loss * self.cfg.world_size, scale_wrt_gas=False)
            if i == len(shard) - 1 and self.cfg.zero_stage == 0 and self.dtype != "bfloat16":
                # ZeRO-0 fp32 neither records the norm nor skips a non-finite step (every other
                # ZeRO stage and bf16 skip it themselves). The gradients are all-reduced by now,
                # so every rank sees the same norm and takes the same decision.
                own_norm = _grad_norm(slot.params)
                own_skip = not math.isfinite(own_norm)
            if own_skip:
                self._skip_optimizer_step(slot)
            else:
                eng.step()
            loss_total += loss.item()
            for k, v in metrics.items():
                sums[k] = max(sums.get(k, 0.0), v.item()) if k == "ratio_max" else sums.get(k, 0.0) + v.item()
        slot.step += 1
        skipped = own_skip or eng.skipped_steps > skipped_before
        slot.skipped_steps += skipped
        grad_norm = eng.get_global_grad_norm()
        grad_norm = grad_norm if grad_norm is not None else own_norm
        out = {
            "loss": loss_total,
            "grad_norm": float(grad_norm) if grad_norm is not None else 0.0,
            "lr": slot.scheduler.get_last_lr()[0],
            "step": slot.step,
            "skipped": float(skipped),
            "skipped_steps": float(slot.skipped_steps),
            "tokens": sums.pop("tokens", 0.0),
            "padded_tokens": float(sum(m.input_ids.size for m in shard)),
            "seconds": time.perf_counter() - t0,
        }
        out.update(sums)
        return out

    def _skip_optimizer_step(self, slot: _Slot) -> None:
        """Close the step through DeepSpeed (its micro-step and boundary counts move on) without
        an optimizer step: the weights, the optimizer state and the lr schedule stay untouched.
        The non-finite gradients are zeroed first (gradient clipping still runs on them)."""
        opt = slot.engine.optimizer
        sched, lrs = slot.scheduler.state_dict(), [g["lr"] for g in opt.param_groups]
        for p in slot.params:
            if p.grad is not None:
                p.grad.zero_()
        opt.step = lambda *args, **kwargs: None  # this once; the class's step is back below
        try:
            slot.engine.step()
        finally:
            del opt.step
        slot.scheduler.load_state_dict(sched)
        for g, lr in zip(opt.param_groups, lrs):
            g["lr"] = lr

    def logprobs(
        self, input_ids: list[int], start: int, adapter: str | None = None, temperature: float | None = None
    ) -> list[float]:
        """Learner log-probs of input_ids[start:] at the current weights (of `adapter` on the base),
        at `temperature` (default: the loss's); collective under ZeRO-3."""
        import torch

        from trainer.losses import token_logprobs

        eng = self.activate(adapter).engine
        ids = torch.tensor([input_ids], device=self.device)
        with torch.no_grad():
            logits = eng(input_ids=ids).logits
        temperature = temperature or self.loss_cfg.temperature
        return token_logprobs(logits, ids, temperature)[0, start:].float().tolist()

    # ------------------------------------------------------- weights & state
    def export_weights(self, bucket_bytes: int = 64 << 20, adapter: str | None = None) -> list[bytes] | None:
        """Full weights in the model's dtype (bf16 stays bf16; of `adapter`: its tensors only, under
        PEFT's saved names) as safetensors buckets on rank 0 (None elsewhere); collective."""
        from safetensors.torch import save

        slot = self.activate(adapter)
        named = zip(slot.names, slot.params) if adapter is not None else self.module.named_parameters()
        buckets, current, size = [], {}, 0
        for name, t in gathered(named, self.cfg.zero_stage == 3, self.rank == 0):
            if t is None:  # not rank 0
                continue
            current[saved_name(name, adapter) if adapter is not None else name] = t
            size += t.numel() * t.element_size()
            if size >= bucket_bytes:
                buckets.append(save(current))
                current, size = {}, 0
        if current:
            buckets.append(save(current))
        return buckets if self.rank == 0 else None

    def weight_identity(self) -> str:
        """Rank 0's device (rollout/engine/weight_group.py::device_identity): which transport each
        engine worker takes."""
        from rollout.engine.weight_group import device_identity

        return device_identity(self.device)

    def prepare_weight_group(self, plan, layout: Layout, timeout_s: float):
        """Rank 0, before `open_weight_group`: the staging buffers `plan`'s ipc members read from
        (none without one); a group opened before is closed first. Returns the plan with those
        buffers' handles, which the engine workers join with."""
        from trainer.weight_transport import staging_for

        assert self.rank == 0, "only learner rank 0 sends weights to the engines"
        if self.weight_group is not None:
            self.weight_group.close()
            self.weight_group = None
        plan, buffers = staging_for(plan, layout, self.device)
        self._pending_group = (plan, buffers, timeout_s)
        return plan

    def open_weight_group(self) -> None:
        """Rank 0: host the group `prepare_weight_group` planned (the engine workers join meanwhile)."""
        from rollout.engine.weight_group import WeightGroup

        plan, buffers, timeout_s = self._pending_group
        self.weight_group = WeightGroup(plan, 0, self.device, timeout_s, buffers)

    def weight_layout(self, bucket_bytes: int = 64 << 20) -> Layout:
        """The (name, shape, dtype) of every parameter `broadcast_weights` sends, in buckets of
        about `bucket_bytes` (the full model; the engine maps HF names itself)."""
        layout, bucket, size = [], [], 0
        for name, p in self.module.named_parameters():
            shape = list(getattr(p, "ds_shape", p.shape))  # ZeRO-3 keeps the full shape aside
            bucket.append((name, shape, str(p.dtype).removeprefix("torch.")))
            size += p.element_size() * math.prod(shape)
            if size >= bucket_bytes:
                layout.append(bucket)
                bucket, size = [], 0
        return layout + ([bucket] if bucket else [])

    def broadcast_weights(self, version: int, layout: Layout) -> float:
        """Send the parameters in `layout` order over the weight group as `version`, straight from
        the module (gathered bucket by bucket under ZeRO-3, where every rank takes part); returns
        rank 0's seconds, the transfer finished on the device."""
        import deepspeed

        t0 = time.perf_counter()
        params = dict(self.module.named_parameters())

        def buckets():
            for bucket in layout:
                ps = [params[name] for name, _, _ in bucket]
                with deepspeed.zero.GatheredParameters(ps, modifier_rank=None, enabled=self.cfg.zero_stage == 3):
                    yield [p.detach() for p in ps]

        if self.rank == 0:
            self.weight_group.send(version, layout, buckets(), transient=self.cfg.zero_stage == 3)
        else:
            for _ in buckets():  # the gathers of ZeRO-3 need every rank
                pass
        return time.perf_counter() - t0

    def save(self, path: str, adapter: str | None = None) -> None:
        """DeepSpeed state (model or `adapter`, optimizer, scheduler) + step; collective."""
        slot = self.activate(adapter)
        # An adapter is saved alone: the frozen base (the model the run started from) and the
        # other adapters (requires_grad off while this one is active) are left out.
        slot.engine.save_checkpoint(
            path,
            tag="state",
            client_state={"step": slot.step, "adapter": adapter},
            exclude_frozen_parameters=adapter is not None,
        )

    def load(self, path: str, adapter: str | None = None) -> int:
        """Restore what `save` wrote; returns the step. Collective."""
        from trainer.torch_load import WeightsOnlyLoads

        slot = self.activate(adapter)
        if adapter is not None:
            self._check_adapter_state(path, slot)
        # DeepSpeed's own loads unpickle with weights_only=False: a file that holds more than
        # tensors and its data classes is refused instead of run (trainer/torch_load.py)
        engine = slot.engine
        own, engine.checkpoint_engine = engine.checkpoint_engine, WeightsOnlyLoads(engine.checkpoint_engine)
        try:
            _, client = engine.load_checkpoint(
                path,
                tag="state",
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
                load_module_strict=adapter is None,
            )
        finally:
            engine.checkpoint_engine = own
        slot.step = int(client["step"])
        return slot.step

    def _check_adapter_state(self, path: str, slot: _Slot) -> None:
        """An adapter's state loads without strictness (the base is not in it): make sure it holds
        every tensor of this adapter, or the load would leave them as they are, silently."""
        import glob

        from trainer.torch_load import load_torch

        [states] = glob.glob(os.path.join(path, "state", "mp_rank_00_model_states.pt")) or [None]
        if states is None:
            raise FileNotFoundError(f"{path}: no DeepSpeed model state (state/mp_rank_00_model_states.pt)")
        saved = set(load_torch(states)["module"])
        missing = [n for n in slot.names if n not in saved]
        if missing:
            raise ValueError(
                f"{path} does not hold this adapter's tensors ({len(missing)} of {len(slot.names)} "
                f"missing, e.g. {missing[0]}): a checkpoint of another policy or another LoRA layout"
            )

    def info(self) -> dict:
        """This rank's process (what a fault test strikes)."""
        return {"rank": self.rank, "pid": os.getpid()}

    def rss(self) -> int:
        """This rank's resident memory, bytes."""
        import psutil

        return psutil.Process().memory_info().rss

    def base_digest(self) -> str:
        """A hash of the weights that no slot trains, under the base model's own names (with
        adapters: the frozen base, which must never change); gathered under ZeRO-3."""
        trained = {id(p) for slot in self.slots.values() for p in slot.params}
        frozen = {
            n.removeprefix("base_model.model.").replace(".base_layer.", "."): p
            for n, p in self.module.named_parameters()
            if id(p) not in trained
        }
        return digest(sorted(frozen.items()), self.cfg.zero_stage == 3)

    def param_digest(self, adapter: str | None = None) -> str:
        """A hash of this rank's full parameters (of `adapter`: its own only; gathered under
        ZeRO-3), to compare ranks."""
        params = self.slots[adapter].params if adapter is not None else list(self.module.parameters())
        return digest(((None, p) for p in params), self.cfg.zero_stage == 3)

    # ------------------------------------------------------ full weights on rank 0
    def write_hf(self, folder: str, base_model: str, shard_bytes: int) -> dict | None:
        """Rank 0 writes the full model into `folder` as an HF model folder (trainer/hf_folder.py),
        holding one shard of at most `shard_bytes` at a time; returns the files' names and sizes and
        the dtype on rank 0 (None elsewhere): no weights leave the rank. Collective under ZeRO-3."""
        from trainer import hf_folder

        assert not self.adapters, "an adapter policy's checkpoint is its adapter (export_weights), not the model"
        params = dict(self.module.named_parameters())
        sizes = [(n, p.element_size() * math.prod(getattr(p, "ds_shape", p.shape))) for n, p in params.items()]
        plan = hf_folder.plan_shards(sizes, shard_bytes)

        def shards():
            for names in plan:
                yield dict(gathered(((n, params[n]) for n in names), self.cfg.zero_stage == 3, self.rank == 0))

        if self.rank == 0:
            return hf_folder.write(folder, base_model, shards(), len(plan))
        for _ in shards():  # the other ranks take part in ZeRO-3's gathers
            pass
        return None
