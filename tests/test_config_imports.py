"""The config schemas and their checks load without torch, Ray, vLLM or DeepSpeed: composing
and validating a config (scripts, docs, tests) must not pay for the machinery it configures."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

HEAVY = ("torch", "ray", "vllm", "deepspeed")


def test_config_modules_import_nothing_heavy():
    # A fresh interpreter: this test session has long imported all of them.
    code = (
        "import sys; import trainer.config, trainer.checks, rollout.config, rollout.checks; "
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing the config modules loaded: {out.stdout.strip()}"
