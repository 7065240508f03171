"""docs/config.md is what tools/config_reference.py writes from the config dataclasses now:
a key added (or a comment changed) without regenerating fails here, and every key has a line."""

import dataclasses
from pathlib import Path

import pytest

from tools.config_reference import reference
from trainer.config import TrainJobConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_up_to_date():
    from tools.config_reference import OUT

    assert OUT.read_text() == reference(), "docs/config.md is stale: run python -m tools.config_reference"


def test_every_key_has_a_type_a_default_and_a_description():
    from rollout.config import PolicyConfig
    from tools.config_reference import rows
    from trainer.config import TrainJobConfig

    entries = rows(TrainJobConfig, "", None) + rows(PolicyConfig, "policies.<name>.", None)
    assert len(entries) > 100
    assert not [e[0] for e in entries if not (e[1] and e[2] and e[4])], "a field without a comment"


@dataclasses.dataclass
class WithNewKey(TrainJobConfig):
    new_key: int = 7  # a key added without regenerating the page


def test_a_new_field_makes_the_page_stale():
    """The page is made from the schema itself: one more field, and it differs."""
    from tools.config_reference import OUT

    page = reference(WithNewKey)
    assert "| `new_key` | int | `7` |  | a key added without regenerating the page |" in page
    assert page != OUT.read_text()
