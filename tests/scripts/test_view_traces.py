"""scripts/view_traces.py on a real rollout, and the page it writes opened in headless Chromium.

The traces come from the tiny model's engine running the solver_verifier harness through a
RolloutWorker, with the verifier on the frozen policy (served by the same engine, recorded as
trainable=False). Chromium is Debian's package: scripts/setup.sh installs it.
"""

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rollout.config import HarnessConfig
from rollout.trace import read_jsonl, write_jsonl
from rollout.viewer import CSS, GENERATED, MASKED, PROMPT

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def traces_file(run_worker, tmp_path_factory) -> Path:
    harness = HarnessConfig(
        _target_="harnesses.programs.solver_verifier.solver_verifier",
        name="solver_verifier",
        roles=["solver", "verifier"],
    )
    _, groups, _ = run_worker(
        harness, {"solver": "main", "verifier": "frozen"}, n_tasks=2, timeout_s=60.0, max_tokens=24
    )
    traces = [t for g in groups for t in g]
    assert len(traces) == 4 and all(t.status != "failed" for t in traces), [t.error for t in traces]
    path = tmp_path_factory.mktemp("view") / "traces.jsonl"
    write_jsonl(traces, path)
    return path


def background(kind: str) -> tuple[int, int, int]:
    """The first colour of a token kind's background in rollout/viewer.py's CSS, as RGB."""
    hex_ = re.search(rf"\.tv \.{kind}\{{background:[^#]*#([0-9a-f]{{6}})", CSS).group(1)
    return tuple(int(hex_[i : i + 2], 16) for i in (0, 2, 4))


def view_traces(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/view_traces.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def chromium(page: Path, out: Path, screenshot: bool) -> tuple[Path, list[str]]:
    """Load `page` in headless Chromium; return the screenshot and the URLs the page requested.

    Requests come from Chromium's NetLog (--log-net-log): every network request the browser
    starts is there, including ones that fail (no DNS here: --host-resolver-rules maps every
    host to NOTFOUND, so nothing leaves the machine). Chromium also makes its own background
    requests (update checks, accounts); the page's requests are the ones keyed to its site, a
    `network_isolation_key` that starts with file://. A file:// page's own load is not a
    network request, so a self-contained page makes none.
    """
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup.sh (it installs Debian's chromium as root)")
    profile, netlog, png = out / "profile", out / "netlog.json", out / "page.png"
    shutil.rmtree(profile, ignore_errors=True)
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        f"--log-net-log={netlog}",
        "--window-size=1280,2000",
        f"--screenshot={png}" if screenshot else "--dump-dom",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = json.loads(netlog.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = [
        e["params"]["url"]
        for e in log["events"]
        if e["type"] == start_job and e.get("params", {}).get("network_isolation_key", "").startswith("file://")
    ]
    return png, urls


class Refs(HTMLParser):
    """Every tag and every attribute that can point at another resource."""

    def __init__(self):
        super().__init__()
        self.tags: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "srcset", "action", "poster", "data")]


@pytest.mark.unit
def test_netlog_sees_a_pages_external_requests(tmp_path):
    """The control for the check below: a page that does load something from outside is caught."""
    page = tmp_path / "leaky.html"
    page.write_text(
        '<!DOCTYPE html><img src="http://127.0.0.1:9/probe.png">'
        '<div style="background:url(https://example.invalid/bg.png)">x</div>'
    )
    _, urls = chromium(page, tmp_path, screenshot=False)
    assert sorted(set(urls)) == ["http://127.0.0.1:9/probe.png", "https://example.invalid/bg.png"]


@pytest.mark.integration
def test_page_of_a_real_rollout(traces_file, tmp_path):
    """The page shows the real traces, is self-contained, and renders in a browser.

    No external resources, checked twice: statically, the HTML has no tag that loads
    anything (link, script, img, ...), no src at all, only #fragment hrefs, and no url() /
    @import / http(s):// / protocol-relative // reference in its text; dynamically, Chromium
    loads the page and its NetLog shows no request made for the page (see `chromium`; the
    test above shows that check catches a page that does make one).
    """
    out = tmp_path / "traces.html"
    proc = view_traces(str(traces_file), "-o", str(out), "--model", "tiny")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[view] wrote {out} (4 traces" in proc.stdout
    page = out.read_text()
    traces = list(read_jsonl(traces_file))
    assert all(f"<code>{t.id}</code>" in page for t in traces)
    sections = page.split('<details class="trace"')[1:]
    assert len(sections) == 4
    for s in sections:
        # solver turns #0 and #2 merge into one row, #2 shows only its new prompt tokens;
        # the frozen verifier (#1) is masked and in no row
        assert "row 1 (#0 → #2)" in s and "frozen: not trained" in s and "no row (not trained): #1" in s
        assert s.count('class="tok generated"') == 2 and s.count('class="tok masked"') == 1
        assert s.count('class="tok prompt"') == 3 and s.count('class="hidden"') == 1

    refs = Refs()
    refs.feed(page)
    assert not refs.tags & {
        "link",
        "script",
        "img",
        "iframe",
        "object",
        "embed",
        "audio",
        "video",
        "source",
        "base",
        "form",
        "svg",
        "image",
        "use",
    }, refs.tags
    assert refs.refs and all(r.startswith("#") for r in refs.refs), refs.refs
    lowered = page.lower()
    assert not any(s in lowered for s in ("http://", "https://", "url(", "@import", '="//', "='//"))

    png, urls = chromium(out, tmp_path, screenshot=True)
    assert urls == [], f"the page requested {urls}"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, len(data)
    try:
        from PIL import Image
    except ImportError:  # the size and header above are all we can check without PIL
        return
    image = Image.open(png).convert("RGB")
    assert image.size == (1280, 2000)
    colours = dict((c, n) for n, c in image.getcolors(maxcolors=1 << 20))
    assert len(colours) > 50, "the screenshot is (nearly) one flat colour"
    for kind in (PROMPT, GENERATED, MASKED):  # each kind of token is there, in its own colour
        rgb = background(kind)
        assert colours.get(rgb, 0) > 200, f"no {kind} token background {rgb} in the screenshot"


@pytest.mark.integration
def test_errors_name_the_fix(tmp_path, traces_file):
    missing = view_traces(str(tmp_path / "nope.jsonl"), "--model", "tiny")
    assert missing.returncode == 2 and "does not exist" in missing.stderr

    no_model = view_traces(str(traces_file))
    assert no_model.returncode == 2 and "--model is required" in no_model.stderr

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("model:\n  name: smollm2_135m\n  path: null\n")
    shutil.copy(traces_file, run_dir / "traces.jsonl")
    in_run = view_traces(str(run_dir / "traces.jsonl"))
    assert in_run.returncode == 2 and "looks like a run dir" in in_run.stderr
    assert "--model smollm2_135m" in in_run.stderr

    bad = tmp_path / "bad.jsonl"
    lines = traces_file.read_text().splitlines()
    broken = json.loads(lines[1])
    broken["sequences"][0]["logprobs"].append(-0.1)
    bad.write_text("\n".join([lines[0], json.dumps(broken)]) + "\n")
    malformed = view_traces(str(bad), "--model", "tiny")
    assert malformed.returncode == 1, malformed.stderr
    assert f"malformed traces file: {bad}:2: logprobs has" in malformed.stderr

    assert view_traces(str(traces_file), "--model", str(tmp_path)).returncode == 2  # no tokenizer there
    limited = view_traces(str(traces_file), "-o", str(tmp_path / "two.html"), "--model", "tiny", "--limit", "2")
    assert limited.returncode == 0 and "2 of 4 traces" in limited.stdout
    assert (tmp_path / "two.html").read_text().count('<details class="trace"') == 2
