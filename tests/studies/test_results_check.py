"""studies/results_check.py: docs/results.md's checked tables are what the committed per-item files
say; a number changed on the page, an unknown table or a summary that disagrees with its items
fails, naming it."""

from __future__ import annotations

import json
import shutil

import pytest

from studies.relay.__main__ import write_analysis
from studies.results_check import PAGE, ROOT, check, main

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

RESULTS = ROOT / "docs" / "results"


def test_the_committed_page_matches_its_files(capsys):
    main([])  # exits 1 on a difference
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tables = {"runs", "relay_pilot", "relay_runs", "relay_controls", "relay_analysis"}
    assert tables <= set(summary["tables"]) and summary["differ"] == []


def test_a_number_changed_on_the_page_fails_naming_its_table_and_write_restores_it(tmp_path, capsys):
    page = PAGE.read_text(encoding="utf-8")
    block = page.index("<!-- results_check: relay_pilot -->")
    at = page.index("| 0.176 |", block)
    tampered = tmp_path / "results.md"
    tampered.write_text(page[:at] + "| 0.177 |" + page[at + len("| 0.176 |") :], encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        main(["--page", str(tampered)])
    out = capsys.readouterr().out
    assert exit_.value.code == 1 and "relay_pilot: the page differs" in out and "+| 1 | 512 | 0.176 |" in out, out
    main(["--page", str(tampered), "--write"])
    assert tampered.read_text(encoding="utf-8") == page


def test_an_unknown_table_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="no table 'relay_mains' to check.*relay_runs"):
        check("<!-- results_check: relay_mains -->\n<!-- /results_check -->\n", RESULTS)


def test_a_pilot_summary_that_disagrees_with_its_items_is_refused(tmp_path):
    for ops in (1, 2):
        shutil.copytree(RESULTS / "relay_pilot" / f"ops{ops}", tmp_path / "relay_pilot" / f"ops{ops}")
    pilot = tmp_path / "relay_pilot" / "ops1" / "pilot.json"
    data = json.loads(pilot.read_text())
    data["accuracy"]["team"] = 0.35
    pilot.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="ops1/pilot.json: team accuracy 0.35, its items 0.3281"):
        check("<!-- results_check: relay_pilot -->\n<!-- /results_check -->\n", tmp_path)


def test_only_finished_runs_are_reported(tmp_path):
    """A run still going (status.json `running`) has step files but no row yet."""
    shutil.copytree(RESULTS / "relay", tmp_path / "relay")
    status = tmp_path / "relay" / "team_lora" / "seed1" / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "state": "running"}))
    page, _ = check("<!-- results_check: relay_runs -->\n<!-- /results_check -->\n", tmp_path)
    # the running run's row is gone; the finished runs beside it, of its arm or another, keep theirs
    assert "| team_lora | 1 |" not in page and "| team_shared | 1 |" in page, page
    others = [p for p in (RESULTS / "relay" / "team_lora").glob("seed*/status.json") if p.parent.name != "seed1"]
    finished = [p.parent.name.removeprefix("seed") for p in others if json.loads(p.read_text())["state"] == "finished"]
    assert finished and all(f"| team_lora | {seed} |" in page for seed in finished), page


def test_a_published_run_whose_summary_disagrees_with_its_items_is_refused(tmp_path):
    [run] = [p.parent for p in RESULTS.glob("verifiers_arith_*/run.json")]
    shutil.copytree(run, tmp_path / run.name)
    page, _ = check("<!-- results_check: runs -->\n<!-- /results_check -->\n", tmp_path)
    assert f"| {run.name} |" in page and "0.422 → 0.719 | 21 / 2, p = 6.6e-05" in page, page
    summary = tmp_path / run.name / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "final_eval_reward": 0.75}))
    with pytest.raises(ValueError, match=f"{run.name}/summary.json: final_eval_reward 0.75, its items 0.7188"):
        check("<!-- results_check: runs -->\n<!-- /results_check -->\n", tmp_path)


def test_a_relay_analysis_that_is_not_its_files_is_refused(tmp_path):
    """analysis.json and analysis.md beside the relay's files must be what the analysis writes."""
    for folder in ("relay", "relay_pilot"):
        shutil.copytree(RESULTS / folder, tmp_path / folder)
    relay, block = tmp_path / "relay", "<!-- results_check: relay_analysis -->\n<!-- /results_check -->\n"
    write_analysis(relay)  # what `python -m studies.relay analyze` writes passes
    page, _ = check(block, tmp_path)
    assert "**Verdict: " in page and "| C - A | " in page and "| oracle - C | " in page, page
    (relay / "analysis.json").write_text(
        relay.joinpath("analysis.json").read_text().replace('"success": false', '"success": true')
    )
    with pytest.raises(ValueError, match="analysis.json: not the analysis of the files beside it"):
        check(block, tmp_path)
