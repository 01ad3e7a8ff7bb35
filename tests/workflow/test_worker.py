"""The run's worker: a job's script handed to a process that imported jax and the cases
once, run in a fork with the job's own streams, directory, environment and exit status;
signals relayed; a job whose process is killed is ended; no server, no handoff."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from casebook.core import paths
from casebook.run import worker

pytestmark = [pytest.mark.timeout(180), pytest.mark.host_rehearsal]
PYTHONPATH = os.pathsep.join([str(paths.SOURCE_ROOT),
                              *filter(None, [os.environ.get("PYTHONPATH")])])

# What a Snakemake script does first; then it reports where it ran and what it found.
SCRIPT = """
import os, sys, time, types
from casebook.run import worker
preloaded = "jax" in sys.modules
worker.fork_from_server(types.SimpleNamespace(threads=int(os.environ.get("JOB_THREADS", 1))),
                        pins_itself=bool(os.environ.get("JOB_PINS")))
print(f"pid={os.getpid()} preloaded={preloaded} jax_now={'jax' in sys.modules} "
      f"cwd={os.getcwd()} value={os.environ.get('JOB_VALUE')} argv={sys.argv[1:]}")
sys.stderr.write("to stderr\\n")
mode = os.environ.get("JOB_MODE", "")
if mode == "sleep":
    open("started", "w").write(str(os.getpid()))
    time.sleep(60)
elif mode == "raise":
    raise RuntimeError("the job's own failure")
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A worker serving this test process's jobs (its parent: this process)."""
    folder = tmp_path_factory.mktemp("worker")
    before = os.environ.get(worker.SOCKET)
    process = worker.start(folder)
    path = Path(os.environ[worker.SOCKET])
    for _ in range(600):  # it listens once everything is imported
        if path.exists() or process.poll() is not None:
            break
        time.sleep(0.1)
    assert path.exists(), "the worker never listened"
    yield path
    worker.stop(process)
    assert process.returncode is not None and not path.exists()
    if before is not None:
        os.environ[worker.SOCKET] = before


def run_job(tmp_path: Path, socket_path: Path | None, **env: str):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    environment = {k: v for k, v in os.environ.items() if k != worker.SOCKET}
    if socket_path is not None:
        environment[worker.SOCKET] = str(socket_path)
    environment["PYTHONPATH"] = PYTHONPATH
    return subprocess.run([sys.executable, str(script), "an-arg"], cwd=tmp_path,
                          env={**environment, **env}, capture_output=True, text=True)


def facts(stdout: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in stdout.split() if "=" in item)


def test_a_job_runs_in_a_fork_of_the_worker_with_its_own_streams_and_environment(
        server, tmp_path):
    done = run_job(tmp_path, server, JOB_VALUE="42")
    assert done.returncode == 0, done.stderr
    found = facts(done.stdout)
    assert found["preloaded"] == "True"  # ran in the worker: jax was already imported
    assert found["cwd"] == str(tmp_path) and found["value"] == "42"
    assert found["argv"] == "['an-arg']"
    assert done.stderr == "to stderr\n"
    again = facts(run_job(tmp_path, server).stdout)
    assert again["pid"] != found["pid"]  # a fresh fork per job


@pytest.mark.parametrize("env, status, message", [
    ({"JOB_EXIT": "3"}, 3, None),
    ({"JOB_MODE": "raise"}, 1, "RuntimeError: the job's own failure"),
])
def test_the_jobs_exit_status_and_failure_are_its_process(server, tmp_path, env, status,
                                                          message):
    done = run_job(tmp_path, server, **env)
    assert done.returncode == status
    assert facts(done.stdout)["preloaded"] == "True"
    if message:
        assert message in done.stderr


def test_a_job_of_several_threads_runs_in_its_own_process_unless_it_pins_itself(
        server, tmp_path):
    done = run_job(tmp_path, server, JOB_THREADS="2")
    assert done.returncode == 0 and facts(done.stdout)["preloaded"] == "False"
    pinned = run_job(tmp_path, server, JOB_THREADS="2", JOB_PINS="1")
    assert pinned.returncode == 0 and facts(pinned.stdout)["preloaded"] == "True"


def test_without_a_server_the_job_runs_in_its_own_process(tmp_path):
    done = run_job(tmp_path, None)
    found = facts(done.stdout)
    assert done.returncode == 0 and found["preloaded"] == "False"
    gone = run_job(tmp_path, tmp_path / "no-such.sock")  # a server that is gone
    assert gone.returncode == 0 and facts(gone.stdout)["preloaded"] == "False"


def _wait_for(path: Path) -> int:
    for _ in range(300):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def _gone(pid: int) -> bool:
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_job_ends_its_child(server, tmp_path, how):
    """SIGTERM is relayed to the child; a job process killed outright (no relay) closes
    its connection, and the worker ends the child."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, worker.SOCKET: str(server), "JOB_MODE": "sleep",
           "PYTHONPATH": PYTHONPATH}
    job = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = _wait_for(tmp_path / "started")
    assert child != job.pid
    job.send_signal(how)
    job.wait(timeout=30)
    assert _gone(child), f"the job's child {child} outlived its job"
    if how == signal.SIGTERM:
        assert job.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize("unsafe, why", [
    # a thread that waits for ever (a daemon: the probe exits); one that slept a while
    # could end before a slow host reached the check
    ("threading.Thread(target=threading.Event().wait, daemon=True).start()",
     "2 threads run"),
    ("jax.numpy.zeros(1)", "an XLA backend started (cpu)"),
])
def test_a_process_with_a_thread_or_a_backend_is_not_forked(unsafe, why):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **dict.fromkeys(worker.ONE_THREAD, "1")}
    probe = ("import threading, time\n"
             "import jax\n"
             "from casebook.run import worker\n"
             "assert worker.fork_safe() is None\n"
             f"{unsafe}\n"
             "print(worker.fork_safe())\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == why


def test_the_worker_ends_with_the_run_that_started_it(tmp_path):
    """Its parent gone (a run killed outright), the server stops and removes its socket."""
    path = tmp_path / "w.sock"
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = subprocess.Popen([sys.executable, "-m", "casebook.run.worker", str(path),
                               str(run.pid)], env={**os.environ, "JAX_PLATFORMS": "cpu"})
    # Its parent is this test, not ``run``: it must stop at once, serving nothing.
    assert server.wait(timeout=120) == 0
    assert not path.exists()
    run.kill()
    run.wait()


def test_a_forked_jobs_profile_counts_its_own_process_from_its_start(monkeypatch):
    """The fork starts late and fresh: its profile adds the start and the CPU of the
    process Snakemake started, which the worker passes on."""
    import json

    from casebook.core import jobprofile

    entered = time.time()
    alone = json.loads(jobprofile.line("verify", entered).removeprefix(jobprofile.PREFIX))
    monkeypatch.setenv(jobprofile.JOB_STARTED, repr(entered - 5))
    monkeypatch.setenv(jobprofile.JOB_CPU_S, "7")
    forked = json.loads(jobprofile.line("verify", entered).removeprefix(jobprofile.PREFIX))
    assert forked["startup_s"] == pytest.approx(5, abs=0.01)
    assert forked["cpu_s"] - alone["cpu_s"] >= 7 - 0.01  # each rounded to 0.01 s


def test_a_process_start_is_read_to_the_clock_tick():
    """psutil's is up to a second early (Linux's boot time in whole seconds). The start
    lies between the parent's clock just before the spawn (less one clock tick) and the
    child's own clock: bounds no load on the host can break."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    spawned = time.time()
    out = subprocess.run([sys.executable, "-c", "import time\n"
                          "from casebook.core import jobprofile\n"
                          "started = jobprofile.process_started()\n"
                          "print(started, time.time())"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": PYTHONPATH})
    started, child_now = map(float, out.stdout.split())
    assert spawned - tick <= started <= child_now
