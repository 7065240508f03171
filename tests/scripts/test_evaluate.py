"""scripts/evaluate.py: which weights a spec names, pass@k, clear errors before Ray starts, and
end to end: the smoke run's final checkpoint evaluated against its base model gives exactly the
run's own before / after eval (rewards, paired counts, every generated token)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fake_checkpoint
from trainer.config import compose
from trainer.evaluation import pass_at_k, weights_for, with_weights


@pytest.mark.unit
def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0 and pass_at_k(1, 1, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1: the share that passed
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.mark.unit
def test_specs_name_weights_per_trained_policy(tmp_path):
    assert weights_for("tiny", ["main"])["main"].model == {"name": "tiny"}
    hf = hf_folder(tmp_path / "hf")
    assert weights_for(str(hf), ["a", "b"])["b"].model == {"path": str(hf)}
    run = tmp_path / "run"
    for step in (2, 4):
        fake_checkpoint(run, step)
        hf_folder(run / "checkpoints" / f"step_00000{step}" / "main" / "hf")
    newest = run / "checkpoints" / "step_000004" / "main" / "hf"
    assert weights_for(str(run), ["main"])["main"].model == {"path": str(newest)}  # a run dir: its newest
    assert weights_for(str(newest.parents[1]), ["main"])["main"].source == str(newest)
    with pytest.raises(ValueError, match=r"--reference .*has no weights of trained policy 'critic'"):
        weights_for(str(run), ["main", "critic"], flag="--reference")


@pytest.mark.unit
def test_an_adapter_needs_its_base(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    conf = {
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["v_proj", "q_proj"],
        "base_model_name_or_path": str(tmp_path / "gone"),
    }
    (adapter / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(ValueError, match="which is not here: give its base with --adapter-base"):
        weights_for(str(adapter), ["main"])
    w = weights_for(str(adapter), ["main"], adapter_base="tiny")["main"]
    assert (w.model, w.lora, w.adapter) == (
        {"name": "tiny"},
        {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]},
        adapter,
    )


@pytest.mark.unit
def test_only_trained_policies_change_weights(tmp_path):
    cfg = compose("train", ["experiment=smollm2_solver_verifier"])
    hf = hf_folder(tmp_path / "hf")
    moved = with_weights(cfg, weights_for(str(hf), cfg.trainable_policies()))
    assert moved.policy_model("main").path == str(hf) and moved.policy_model("main").max_model_len == 2048
    assert moved.policy_model("frozen") == cfg.policy_model("frozen")  # the frozen verifier keeps SmolLM2
    assert cfg.policy_model("main").path is None  # the config itself is not changed


@pytest.mark.unit
@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/no/such/checkpoint"], "--model /no/such/checkpoint: no such folder"),
        (["--reference", "/tmp"], "--reference /tmp: the folder holds no config.json"),
        (["eval.size=0"], "eval.size=0: nothing to evaluate"),
        (["eval.size=99"], "eval.size=99 is more than the task's held-out set"),
        (["trainer.stepz=1"], "Could not override 'trainer.stepz'"),
        (["eval"], "'eval' is neither a flag nor a hydra override (key=value, ~key)"),
    ],
)
def test_bad_arguments_fail_before_ray_starts(args, message, capsys):
    from scripts.evaluate import main

    with pytest.raises(SystemExit) as e:
        main(["experiment=smoke", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.unit
def test_hydras_deletion_override_is_taken():
    """`~key` (docs/textarena.md drops the frozen opponent's role with `~agents.opponent`) is an
    override, not an unknown argument."""
    from scripts.evaluate import parse

    assert parse(["experiment=smoke", "~agents.frozen", "--k", "2"]).overrides == ["experiment=smoke", "~agents.frozen"]


@pytest.mark.e2e
def test_a_checkpoint_against_its_base_gives_the_runs_own_eval(smoke_run, ray_cluster, tmp_path, capsys):
    """evaluate.py's main in this process, on the session's Ray: its engines, fleet, report and
    output are the script's own, and the cluster it did not start stays up. (A subprocess would
    add a driver's imports and a Ray start, ~10 CPU-s; the arguments go through the same main as
    in the tests above, and tests/studies/test_relay_runs_quick.py runs the script as a process.)"""
    import ray

    from rollout.trace import read_jsonl
    from scripts.evaluate import main

    run, train_proc = smoke_run  # the session's `scripts/train.py experiment=smoke` run: 20 steps, 32 held out
    assert train_proc.returncode == 0, train_proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    out = tmp_path / "eval" / "smoke.json"
    main(["experiment=smoke", "--model", str(run), "--reference", "tiny", "--out", str(out), "--progress-s", "1"])
    stdout = capsys.readouterr().out
    assert ray.is_initialized(), "evaluate.py shut down a cluster it did not start"
    result = json.loads(out.read_text())
    assert result["model"]["reward"] == summary["final_eval_reward"]
    assert result["reference"]["reward"] == summary["initial_eval_reward"]
    assert result["eval_paired"] == summary["eval_paired"] and result["eval_paired"]["questions"] == 32
    assert result["model"]["failed"] == 0 and result["model"]["pass_at_k"] == summary["final_eval"]["eval/success"]
    for label, step in (("model", 20), ("reference", 0)):  # the same generated tokens, item by item
        ours = read_jsonl(out.with_suffix(f".{label}.jsonl"))
        runs = read_jsonl(run / f"eval/step_{step}.jsonl")
        assert [(t.id, t.sequences[0].completion_ids) for t in ours] == [
            (t.id, t.sequences[0].completion_ids) for t in runs
        ]
        assert "<html" in out.with_suffix(f".{label}.html").read_text()[:200]
    assert "[evaluate] model: 32/32 runs" in stdout
    assert json.loads(stdout.splitlines()[-1])["eval_paired"] == summary["eval_paired"]
