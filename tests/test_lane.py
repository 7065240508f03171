"""The background lane (tests/lane.py): one job at a time while the main tests run, two at once
from the first test that waits for one (those run last) where the machine has room for a second,
each job's failure raised in its test; a job with a Ray of its own is not told the lane's cluster."""

from pathlib import Path

import pytest

from tests.conftest import run_bare_python

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# A job: says it started, then (job "a") holds its worker until the file `go` exists; its JSON
# line names the jobs that had started by then, and whether it was told to join the lane's cluster.
JOB = """
import json, os, sys, time
from pathlib import Path
d, name = Path(sys.argv[1]), sys.argv[2]
(d / f"{name}.start").touch()
deadline = time.monotonic() + 60
while name == "a" and not (d / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
assert name != "a" or (d / "go").exists(), "never let go"
joined = "TRACERL_RAY_ADDRESS" in os.environ
print(json.dumps({"started": sorted(p.stem for p in d.glob("*.start")), "joined": joined}))
"""
DRIVER = """
import sys, threading, time
from pathlib import Path
from tests import lane

d = Path(sys.argv[1])
lane.SECOND_JOB_BELOW_GIB = float(sys.argv[2])  # inf: always room; 0: never
job = lambda name, own_ray=False: lane.Job(["-c", {job!r}, str(d), name], 120, own_ray)
lane.launch({{"a": job("a"), "b": job("b", own_ray=True), "fails": (["-c", "raise SystemExit(3)"], 60)}})

def wait_for(path):
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), path

wait_for(d / "a.start")
assert not (d / "b.start").exists(), "one job at a time before a test waits"
got = {{}}
threading.Thread(target=lambda: got.update(b=lane.result("b"))).start()  # a test waits: two workers
if lane.SECOND_JOB_BELOW_GIB > 0:
    wait_for(d / "b.start")  # b runs beside a, which still holds the first worker
(d / "go").touch()
print("a", lane.result("a"))
try:
    lane.result("fails")
except AssertionError as e:
    print("fails raised", type(e).__name__)
print(lane.stop())
print("b", got["b"])
"""


@pytest.mark.parametrize(("below_gib", "beside_a"), [("inf", ["a", "b"]), ("0", ["a"])], ids=["room", "no_room"])
def test_the_lane_runs_one_job_until_a_test_waits_then_two_and_raises_a_jobs_failure(tmp_path, below_gib, beside_a):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(job=JOB))
    rc, out = run_bare_python([str(driver), str(tmp_path), below_gib], ROOT, timeout_s=300)
    assert rc == 0, out
    # b started while a ran, where there was room; a joined the lane's Ray cluster, b (own_ray) did not
    assert f"a {{'started': {beside_a}, 'joined': True}}" in out, out
    assert "fails raised AssertionError" in out and "b {'started': ['a', 'b'], 'joined': False}" in out, out
    assert "background lane (job start+wall): " in out and all(f"{n} " in out for n in ("a", "b", "fails")), out
