"""studies/plot_results.py draws every published run's curves from its committed metrics."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def test_every_published_run_is_small_trimmed_and_has_its_figure():
    from studies.plot_results import trim

    runs = sorted(p.parent for p in RESULTS.glob("*/metrics.jsonl"))
    assert runs, "no published runs"
    for run in runs:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(trim(r) == r for r in rows), f"{run.name}: metrics not trimmed to the plotted keys"
        assert (run / "metrics.jsonl").stat().st_size < 64_000
        assert (run / "curves.png").exists(), f"{run.name}: run python -m studies.plot_results"
        assert f"results/{run.name}/curves.png" in (ROOT / "docs" / "results.md").read_text(), run.name


def test_plot_results_writes_a_png_per_run(tmp_path):
    for run in RESULTS.glob("*/metrics.jsonl"):
        (tmp_path / run.parent.name).mkdir()
        shutil.copy(run, tmp_path / run.parent.name / "metrics.jsonl")
    proc = subprocess.run(
        [sys.executable, "-m", "studies.plot_results", "--results", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    pngs = sorted(tmp_path.glob("*/curves.png"))
    assert len(pngs) == len(list(RESULTS.glob("*/metrics.jsonl")))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000 for p in pngs)
