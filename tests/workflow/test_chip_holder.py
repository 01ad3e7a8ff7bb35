"""The run's chip holder: a TPU target's chip-holding jobs run one after another in the
one process that opened the device, each with its own streams, directory, arguments,
environment and exit status, the holder's own put back after it; jobs that do not hold
the chip, and every job where no holder answers, run in their own processes. On this
host the holder opens jax's CPU backend: the mechanism is the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from casebook.core import paths
from casebook.run import chip_holder, worker

pytestmark = pytest.mark.timeout(240)
PYTHONPATH = os.pathsep.join([str(paths.SOURCE_ROOT),
                              *filter(None, [os.environ.get("PYTHONPATH")])])

# What a Snakemake script of the time stage does first, then what it found.
SCRIPT = """
import os, sys, time, types
from casebook.run import worker
job = types.SimpleNamespace(
    wildcards=types.SimpleNamespace(target=os.environ.get("JOB_TARGET", "tpu-v5e")),
    resources=types.SimpleNamespace(gpu=int(os.environ.get("JOB_GPU", "1"))), threads=4)
worker.fork_from_server(job)
print(f"pid={os.getpid()} cwd={os.getcwd()} value={os.environ.get('JOB_VALUE')} "
      f"leaked={os.environ.get('LEAKED')} argv={sys.argv[1:]} "
      f"platforms={os.environ.get('JAX_PLATFORMS')} "
      f"target_platform={os.environ.get('CASEBOOK_TARGET_PLATFORM')}")
sys.stderr.write("to stderr\\n")
os.environ["LEAKED"] = "yes"
mode = os.environ.get("JOB_MODE", "")
if mode == "sleep":
    open("started", "w").write(str(os.getpid()))
    time.sleep(60)
elif mode == "raise":
    raise RuntimeError("the job's own failure")
elif mode == "crash":
    os._exit(7)
elif mode == "watch":  # what every job script does first (casebook.core.errors.reported)
    from casebook.core import errors
    errors.end_with_run()
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
"""


def _start(folder: Path) -> tuple[subprocess.Popen, Path]:
    before = os.environ.get("JAX_PLATFORMS")
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        holder = chip_holder.start(folder / "sock", folder / "reports")
    finally:
        if before is None:
            os.environ.pop("JAX_PLATFORMS")
        else:
            os.environ["JAX_PLATFORMS"] = before
    path = Path(os.environ.pop(worker.CHIP_SOCKET))
    assert os.environ.pop(worker.CHIP_HOLDER_PID) == str(holder.pid)
    return holder, path


def _listening(holder: subprocess.Popen, path: Path) -> None:
    for _ in range(1200):  # it listens once the device is open
        if path.exists() or holder.poll() is not None:
            break
        time.sleep(0.1)
    assert path.exists(), "the chip holder never listened"


@pytest.fixture
def holder(tmp_path):
    process, path = _start(tmp_path)
    HOLDERS[str(path)] = process.pid
    _listening(process, path)
    yield process, path, tmp_path / "reports"
    chip_holder.stop(process)
    assert process.returncode is not None


def run_job(folder: Path, socket_path: Path | None, pid: int | None = None, **env: str):
    script = folder / "job.py"
    script.write_text(SCRIPT)
    environment = {k: v for k, v in os.environ.items()
                   if k not in (worker.SOCKET, worker.CHIP_SOCKET, "JAX_PLATFORMS")}
    if socket_path is not None:
        environment[worker.CHIP_SOCKET] = str(socket_path)
        environment[worker.CHIP_HOLDER_PID] = str(pid or _pid_of(socket_path))
    environment["PYTHONPATH"] = PYTHONPATH
    return subprocess.run([sys.executable, str(script), "an-arg"], cwd=folder,
                          env={**environment, **env}, capture_output=True, text=True,
                          timeout=120)


HOLDERS: dict[str, int] = {}


def _pid_of(socket_path: Path) -> int:
    return HOLDERS.get(str(socket_path), 0)


def facts(stdout: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in stdout.split() if "=" in item)


def test_chip_jobs_run_in_turn_in_the_holder_each_with_its_own_process_state(holder,
                                                                              tmp_path):
    process, path, reports = holder
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    first = run_job(first_dir, path, JOB_VALUE="42")
    second = run_job(second_dir, path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    one, two = facts(first.stdout), facts(second.stdout)
    assert one["pid"] == two["pid"] == str(process.pid)  # the one process that opened it
    assert one["cwd"] == str(first_dir) and two["cwd"] == str(second_dir)
    assert one["value"] == "42" and two["value"] == "None"
    assert two["leaked"] == "None"  # the first job's environment was not kept
    assert one["argv"] == "['an-arg']" and one["target_platform"] == "tpu"
    assert first.stderr == "to stderr\n"
    report = json.loads(next(reports.glob("*.json")).read_text())
    assert report["jobs"] == 2 and report["failed"] == 0 and report["opened_s"] > 0
    assert report["device_kind"] == "cpu"


@pytest.mark.parametrize("env, status, message", [
    ({"JOB_EXIT": "3"}, 3, None),
    ({"JOB_MODE": "raise"}, 1, "RuntimeError: the job's own failure"),
])
def test_a_failed_job_fails_alone_and_the_holder_serves_the_next(holder, tmp_path, env,
                                                                 status, message):
    process, path, reports = holder
    done = run_job(tmp_path, path, **env)
    assert done.returncode == status
    assert facts(done.stdout)["pid"] == str(process.pid)
    if message:
        assert message in done.stderr
    after = run_job(tmp_path, path)
    assert after.returncode == 0 and facts(after.stdout)["pid"] == str(process.pid)
    report = json.loads(next(reports.glob("*.json")).read_text())
    assert report["jobs"] == 2 and report["failed"] == 1


def test_a_job_that_ends_the_holder_fails_and_the_next_opens_the_chip_itself(holder,
                                                                            tmp_path):
    process, path, _ = holder
    crashed = run_job(tmp_path, path, JOB_MODE="crash")
    assert crashed.returncode == 1 and "ended before the job" in crashed.stderr
    assert process.wait(timeout=30) == 7
    alone = run_job(tmp_path, path)
    assert alone.returncode == 0 and facts(alone.stdout)["pid"] != str(process.pid)


@pytest.mark.parametrize("env, platforms", [
    ({"JOB_GPU": "0"}, "cpu"),  # a TPU target's job without the device: kept off the chip
    ({"JOB_TARGET": "cpu"}, "None"),  # another target's job
])
def test_jobs_that_do_not_hold_the_chip_run_in_their_own_process(holder, tmp_path, env,
                                                                 platforms):
    process, path, reports = holder
    done = run_job(tmp_path, path, **env)
    found = facts(done.stdout)
    assert done.returncode == 0 and found["pid"] != str(process.pid)
    assert found["platforms"] == platforms
    assert json.loads(next(reports.glob("*.json")).read_text())["jobs"] == 0


def test_the_holder_outlives_the_run_of_a_job_it_served(holder, tmp_path):
    """A TPU window's step holder serves one Snakemake run after another: a job's watch
    on its own run (errors.end_with_run) must not end the holder when that run ends."""
    process, path, _ = holder
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    first = run_job(tmp_path, path, JOB_MODE="watch", CASEBOOK_RUN_PID=str(run.pid))
    assert first.returncode == 0 and facts(first.stdout)["pid"] == str(process.pid)
    run.wait()
    time.sleep(3)  # the watch polls
    assert process.poll() is None
    second = run_job(tmp_path, path)
    assert second.returncode == 0 and facts(second.stdout)["pid"] == str(process.pid)


def test_a_holder_stopped_between_jobs_ends_through_its_own_exit(holder, tmp_path):
    """A step's end stops its idle holder with SIGTERM: it leaves through its own exit
    (its socket removed, its jobs counted), not through the handler the TPU runtime
    installs when the chip opens, which prints a stack dump into the window's log."""
    process, path, _ = holder
    assert run_job(tmp_path, path).returncode == 0
    chip_holder.stop(process)
    assert process.returncode == 128 + signal.SIGTERM
    assert not path.exists()


def test_a_job_stopped_by_its_run_ends_the_holder_with_it(holder, tmp_path):
    """SIGTERM to the job's process (Snakemake stopping it) is relayed to the holder,
    which the job runs in: the job ends, and the holder with it (the next job of the run,
    if any, opens the chip itself)."""
    process, path, _ = holder
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"},
           worker.CHIP_SOCKET: str(path), worker.CHIP_HOLDER_PID: str(process.pid),
           "JOB_MODE": "sleep", "PYTHONPATH": PYTHONPATH}
    job = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if (tmp_path / "started").exists() and (tmp_path / "started").read_text():
            break
        time.sleep(0.05)
    assert int((tmp_path / "started").read_text()) == process.pid
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    assert process.wait(timeout=30) == -signal.SIGTERM


def test_a_chip_job_started_while_the_holder_opens_the_chip_waits_for_it(tmp_path):
    """Snakemake starts the first chip job at once, while the holder still imports and
    opens the chip: had that job opened the chip itself, the holder could not (the first
    TPU window: "libtpu multi-process lockfile")."""
    process, path = _start(tmp_path)
    try:
        assert not path.exists()  # still importing
        done = run_job(tmp_path, path, pid=process.pid)
        assert done.returncode == 0 and facts(done.stdout)["pid"] == str(process.pid)
    finally:
        chip_holder.stop(process)


def test_a_holder_that_never_opened_the_chip_leaves_the_job_to_its_own_process(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = run_job(tmp_path, tmp_path / "never.sock", pid=gone.pid)
    assert done.returncode == 0 and facts(done.stdout)["pid"] != str(gone.pid)


def test_the_holder_serves_local_runs_that_measure_a_tpu():
    class Workflow:
        local_exec, remote_exec = True, False

    assert chip_holder.serves(Workflow, ["tpu-v5e"])
    assert not chip_holder.serves(Workflow, ["cpu"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid, serves in ((os.getpid(), False), (gone.pid, True)):  # a window's step holder
        with mock.patch.dict(os.environ, {worker.CHIP_SOCKET: "s",
                                          worker.CHIP_HOLDER_PID: str(pid)}):
            assert chip_holder.serves(Workflow, ["tpu-v5e"]) is serves
    Workflow.local_exec = False  # a cluster run: each job is its own allocation
    assert not chip_holder.serves(Workflow, ["tpu-v5e"])


def test_the_window_record_states_the_share_spent_opening_the_chip(tmp_path, monkeypatch):
    """gpu_window reads the holders' reports into its record (tested end to end in
    test_gpu_window with a fake host); here: what a report holds is what ``opened``
    returns."""
    (tmp_path / "1.json").write_text(json.dumps(
        {"pid": 1, "device_kind": "TPU v5 lite", "opened_s": 7.5, "jobs": 3, "failed": 0,
         "job_s": 90.0}))
    (tmp_path / "2.json").write_text("{not json")  # a holder killed while writing: skipped
    found = chip_holder.opened(tmp_path)
    assert [held["opened_s"] for held in found] == [7.5]


def test_every_rule_that_holds_the_device_hands_its_job_to_the_holder():
    """A chip-holding job that opened the chip in its own process fails while the holder
    holds it (the second TPU window's compare jobs: "The TPU is already in use"): the
    script of every rule with a ``gpu`` resource starts by handing its job over."""
    import re

    rules_dir = paths.SOURCE_ROOT / "workflow" / "rules"
    holding = {}
    for smk in sorted(rules_dir.glob("*.smk")):
        for block in re.split(r"^rule ", smk.read_text(), flags=re.M)[1:]:
            script = re.search(r"script:\s*\n\s*\"([^\"]+)\"", block)
            if "gpu=" in block and script:
                holding[block.split(":", 1)[0]] = (rules_dir / script.group(1)).resolve()
    assert {"verify", "time", "baseline", "compare", "noise_floor", "env", "host"} <= set(holding)
    for rule, script in holding.items():
        text = script.read_text()
        assert "worker.fork_from_server(" in text or "measuring(snakemake)" in text, rule
