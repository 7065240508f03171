"""Shared fixtures: one tiny model, one in-process Ray, one engine per test session.

Everything here is real: vLLM's CPU build in an Engine actor, an in-process
Ray cluster, the locally built tiny model with its real tokenizer and chat
template. They are slow to start, so they are shared.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Ray workers inherit the driver's environment: make `tests.*` importable there
# (test-only harnesses live under tests/).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from rollout.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def tiny_tied_path() -> str:
    from rollout.models import resolve_model

    return resolve_model("tiny_tied")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from rollout.cluster import start_ray
    from rollout.config import RayConfig

    # More logical CPUs than cores: test actors are mostly idle.
    start_ray(RayConfig(address="local", num_cpus=8))
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def engine_cfg():
    from rollout.config import EngineConfig

    return EngineConfig(num_cpus=1, kv_cache_gb=0.25, max_num_seqs=32)


@pytest.fixture(scope="session")
def engine(ray_cluster, tiny_path, engine_cfg):
    """One Engine actor serving the tiny model (policy "main")."""
    import ray

    from rollout.cluster import spawn_engines
    from rollout.config import ModelConfig

    [e] = spawn_engines(tiny_path, ModelConfig(name="tiny"), engine_cfg, "main")
    yield e
    ray.get(e.shutdown.remote())
    ray.kill(e)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def hf_tiny(tiny_path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
