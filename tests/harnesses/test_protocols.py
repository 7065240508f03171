"""The agent protocols harness code is typed against (harnesses/base.py `Agent`, `Conversation`) fit the
classes the rollout worker hands in (rollout/agents/client.py), as mypy sees them; a method renamed on
either side fails that check; and every configured harness (conf/harness/*.yaml) is typed with them."""

import importlib
import re
import typing
from pathlib import Path

import pytest
import yaml
from mypy import api

from harnesses.base import Agents

ROOT = Path(__file__).resolve().parents[2]
# Only the project's own modules (and the renamed copies below) are read for their types: torch, vLLM and
# the rest would take minutes and say nothing about the agent API (their names are Any here). A module the
# checked snippet imports that cannot be found is an error, not an Any.
CONFIG = f"""[mypy]
python_version = 3.11
mypy_path = {ROOT}
follow_imports = skip
[mypy-rollout.*,harnesses.*,renamed.*]
follow_imports = silent
"""
# The real classes assigned to the protocols: a missing or differently typed member is an error.
FIT = """
from {protocols} import Agent, Conversation
from {classes} import Agent as RealAgent, Conversation as RealConversation


def agent(a: RealAgent) -> Agent:
    return a


def conversation(c: RealConversation) -> Conversation:
    return c
"""


@pytest.fixture(scope="module")
def mypy_dir(tmp_path_factory):
    """A folder with the config and a cache shared by this module's runs (a cold run reads rollout/ once)."""
    folder = tmp_path_factory.mktemp("mypy")
    (folder / "mypy.ini").write_text(CONFIG)
    (folder / "renamed").mkdir()
    (folder / "renamed" / "__init__.py").write_text("")
    return folder


def check(folder: Path, name: str, source: str) -> tuple[int, str]:
    """mypy's exit status and report on the module `source`, saved in `folder` as `name`.py."""
    (folder / f"{name}.py").write_text(source)
    out, err, status = api.run(
        ["--config-file", str(folder / "mypy.ini"), "--cache-dir", str(folder / "cache"), str(folder / f"{name}.py")]
    )
    return status, out + err


@pytest.mark.unit
def test_the_rollout_agent_classes_satisfy_the_harness_protocols(mypy_dir):
    status, report = check(mypy_dir, "fit", FIT.format(protocols="harnesses.base", classes="rollout.agents.client"))
    assert status == 0, report


@pytest.mark.unit
@pytest.mark.parametrize(
    ("side", "method"),
    [("rollout/agents/client.py", "reply"), ("rollout/agents/client.py", "chat"), ("harnesses/base.py", "reply")],
)
def test_a_method_renamed_on_either_side_fails_the_check(mypy_dir, side, method):
    """The check above can fail: a copy of one side's module with one method renamed no longer fits."""
    source = (ROOT / side).read_text()
    assert source.count(f"async def {method}(") == 1, f"{side} should define {method} once"
    module = f"{Path(side).stem}_{method}"
    (mypy_dir / "renamed" / f"{module}.py").write_text(
        source.replace(f"async def {method}(", f"async def {method}_renamed(")
    )
    sides = {"protocols": "harnesses.base", "classes": "rollout.agents.client"}
    sides["protocols" if side == "harnesses/base.py" else "classes"] = f"renamed.{module}"
    status, report = check(mypy_dir, f"fit_{module}", FIT.format(**sides))
    # mypy names the member the class lacks: the protocol's `reply` (or, renamed there, `reply_renamed`)
    missing = re.search(rf"protocol member:\n\S+ note:\s+{method}(_renamed)?\n", report)
    assert status == 1 and missing, report


@pytest.mark.unit
def test_the_harness_programs_type_check():
    """What `make lint` runs: harnesses/base.py and harnesses/programs/ under pyproject.toml's [tool.mypy]."""
    files = [str(ROOT / "harnesses/base.py"), str(ROOT / "harnesses/programs")]
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), *files])
    assert status == 0, out + err


@pytest.mark.unit
@pytest.mark.parametrize("config", sorted((ROOT / "conf/harness").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_configured_harness_is_typed(config):
    """Each harness takes a typed task and `agents: Agents` and says what it returns."""
    target = yaml.safe_load(config.read_text())["harness"]["_target_"]
    module, _, name = target.rpartition(".")
    hints = typing.get_type_hints(getattr(importlib.import_module(module), name))
    assert {"task", "agents", "return"} <= hints.keys(), f"{target} is not typed: {hints}"
    assert hints["agents"] == Agents, f"{target}: agents is {hints['agents']}, not harnesses.base.Agents"
