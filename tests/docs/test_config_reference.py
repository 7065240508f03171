"""docs/config.md is what scripts/config_reference.py writes from the config dataclasses now:
a key added (or a comment changed) without regenerating fails here, and every key has a line."""

import dataclasses
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_up_to_date():
    from scripts.config_reference import OUT, reference

    assert OUT.read_text() == reference(), "docs/config.md is stale: run python scripts/config_reference.py"


def test_every_key_has_a_type_a_default_and_a_description():
    from scripts.config_reference import rows
    from rollout.config import PolicyConfig
    from trainer.config import TrainJobConfig

    entries = rows(TrainJobConfig, "", None) + rows(PolicyConfig, "policies.<name>.", None)
    assert len(entries) > 100
    assert not [e[0] for e in entries if not (e[1] and e[2] and e[4])], "a field without a comment"


def test_a_new_field_makes_the_page_stale(monkeypatch):
    """The staleness check really sees the schema: a field added to a section changes the page."""
    import scripts.config_reference as ref
    from trainer.config import EvalConfig

    before = ref.reference()
    extra = dataclasses.make_dataclass("EvalConfig", [("new_key", int, dataclasses.field(default=7))],
                                       bases=(EvalConfig,))
    monkeypatch.setattr(ref, "field_comments", lambda cls: {})
    hints = ref.typing.get_type_hints
    monkeypatch.setattr(ref.typing, "get_type_hints",
                        lambda cls: {**hints(cls), "eval": extra} if cls.__name__ == "TrainJobConfig" else hints(cls))
    assert "`eval.new_key`" in ref.reference() and "`eval.new_key`" not in before
