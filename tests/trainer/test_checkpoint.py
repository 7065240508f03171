"""Checkpoint folders meeting damage and crashes: a damaged trainer_state.json, a resume that fell
back past a damaged checkpoint, stale `.partial` folders, steps past 999999, and a pickle in a
torch file that would run code. Real files, no learners (tests/trainer/test_faults.py loads real
DeepSpeed checkpoints)."""

import pytest
import torch

from trainer import checkpoint
from trainer.config import compose
from trainer.loop import check_run_dir
from tests.conftest import fake_checkpoint


def names(paths):
    return [p.name for p in paths]


@pytest.mark.parametrize("damage", ['{"step": 4, "vers', '{"versions": {"main": 4}}', "\x00\x00"])
def test_a_damaged_trainer_state_falls_back_to_the_checkpoint_before(tmp_path, damage, capsys):
    for step in (2, 4):
        fake_checkpoint(tmp_path, step)
    (checkpoint.step_dir(tmp_path, 4) / "trainer_state.json").write_text(damage)  # torn by a crash
    loaded = []
    ckpt, state = checkpoint.load_newest(tmp_path, lambda d, s: loaded.append((d.name, s)))
    assert (ckpt.name, state["step"]) == ("step_000002", 2)
    assert loaded == [("step_000002", {"step": 2, "versions": {"main": 2}})]
    assert "step_000004/trainer_state.json is damaged" in capsys.readouterr().out

    def cfg(steps):
        return compose("train", ["experiment=smoke", f"run_dir={tmp_path}", f"trainer.steps={steps}",
                                 "trainer.resume=auto"])

    check_run_dir(cfg(4))  # resumes from step 2: steps 3 and 4 left
    with pytest.raises(ValueError, match="step_000002 is at step 2 of trainer.steps=2: nothing left to train"):
        check_run_dir(cfg(2))


def test_after_a_fallback_resume_the_checkpoint_just_written_is_kept(tmp_path):
    """Step 4 did not load, the run resumed from step 2 and saved step 3: with keep_last=1 the
    save of step 3 is the one kept (ranked by name it was below step 4 and deleted)."""
    for step in (2, 4):
        fake_checkpoint(tmp_path, step)

    def load(d, state):
        if state["step"] == 4:
            raise RuntimeError("PytorchStreamReader failed reading zip archive")  # the disk filled up

    ckpt, _ = checkpoint.load_newest(tmp_path, load)
    assert ckpt.name == "step_000002"
    fake_checkpoint(tmp_path, 3)
    assert names(checkpoint.prune(tmp_path, keep_last=1, step=3)) == ["step_000002", "step_000004"]
    assert names(checkpoint.complete(tmp_path)) == ["step_000003"]
    assert checkpoint.latest(tmp_path).name == "step_000003"
    fake_checkpoint(tmp_path, 4)
    assert names(checkpoint.prune(tmp_path, keep_last=2, step=4)) == []


def test_checkpoints_rank_by_step_past_999999_and_stale_partials_go_at_the_next_save(tmp_path):
    for step in (999_998, 999_999):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 999_000, complete=False)  # a save of a run before, killed mid-write
    fake_checkpoint(tmp_path, 1_000_000)
    assert not checkpoint.partial_dir(tmp_path, 999_000).exists(), "the stale .partial of another step is removed"
    assert checkpoint.latest(tmp_path).name == "step_1000000"
    assert names(checkpoint.complete(tmp_path)) == ["step_999998", "step_999999", "step_1000000"]
    assert names(checkpoint.prune(tmp_path, keep_last=2, step=1_000_000)) == ["step_999998"]


class RunsCode:
    """Unpickling it calls `open(marker, "w")`: any code could run instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_torch_file_holding_an_object_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"module": {"w": torch.ones(2)}, "step": 3, "name": "x"}, good)
    torch.save({"module": {"w": torch.ones(2)}, "evil": RunsCode(marker)}, bad)
    assert checkpoint.load_torch(good)["step"] == 3
    with pytest.raises(ValueError, match=r"bad\.pt holds a pickled object .* refused.*it refers to io\.open"):
        checkpoint.load_torch(bad)
    assert not marker.exists(), "nothing in the file ran"
