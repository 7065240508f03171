"""Every `scripts/train.py`, `scripts/generate.py`, `scripts/submit.sh` and `make train ARGS=...`
command in the README and docs/ composes: its overrides name keys and presets that exist (Hydra
refuses a key that is not in the schema). Running them is other tests' work."""

import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = {"scripts/train.py": "train", "scripts/submit.sh": "train", "scripts/generate.py": "generate"}


def command_lines(text: str) -> list[str]:
    """The lines of the text's ```bash blocks (continuations joined) and its inline code spans."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
    lines = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return lines + re.findall(r"`([^`\n]+)`", prose.replace("\n", " "))


def commands() -> list[tuple[str, str, list[str]]]:
    """(where, config name, overrides) of every command line in the pages."""
    found = []
    for page in PAGES:
        for line in command_lines(page.read_text()):
            line = line.split(" #")[0]
            make = re.search(r"make train ARGS=(\S+)", line)
            if make:
                found.append((f"{page.name}: {line.strip()}", "train", ["experiment=smollm2_solver_verifier", make[1]]))
            for script, config in SCRIPTS.items():
                if script in line:
                    words = shlex.split(line.split(script, 1)[1])
                    overrides = [w for w in words if "=" in w and not w.startswith("-")]
                    if overrides:  # not a bare mention of the script
                        found.append((f"{page.name}: {line.strip()[:80]}", config, overrides))
    return found


def test_the_pages_hold_commands():
    assert len(commands()) >= 15, commands()


def composable() -> list[tuple[str, str, list[str]]]:
    """The commands this test composes: not those with a config dir of the reader's own
    (`hydra.searchpath=...`), which tests/docs/test_readme.py runs."""
    return [c for c in commands() if not any(o.startswith("hydra.searchpath") for o in c[2])]


@pytest.mark.parametrize("where, config, overrides", composable(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_command_composes(where, config, overrides):
    from trainer.config import compose

    compose(config, overrides)
