"""One process that opens the TPU once and runs a run's chip-holding jobs in turn.

One process at a time can hold a TPU, and opening it costs several seconds (6–10 s a
process on the v5e host, jax's import included): with a process per job, a point's dozen
chip-holding jobs spent minutes opening the chip. ``start`` (the workflow's ``onstart``,
on a local run that measures a TPU target) launches ``serve``, which imports jax, the
cases and casebook, opens the chip and then runs each job that ``worker.hand_over`` sends
it (``off_device.holds_the_chip``) in its own process, not a fork, one at a time (a chip
job that starts while the holder still opens the chip waits for it), with the job's
streams, directory, arguments and environment, its own put back after it. The job's process
stays what Snakemake waits on and exits with the job's status, as with the run's worker.

What one job leaves for the next: modules imported (the point), compiled programs of
functions shared by jobs (no measurement times a compile: warm-up runs first), and the
process's peak memory (a job's profile line reports the holder's peak so far). Arrays a
job held are freed when its globals go (collected after each job). A job that kills the
process (a crash in the runtime) fails alone: the jobs after it find no holder and open
the chip in their own processes, as without one. A TPU window starts one holder for each
step (``casebook.hosts.gpu_window``): the step's runs find it in their environment
(``inherited``) and start none, so a step of seven points opens the chip once.

The holder writes what opening the chip cost and the jobs it ran to
``logs/chip_holder/<pid>.json`` (``casebook.hosts.gpu_window`` adds them to its record).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from casebook.core import errors, files, paths
from casebook.run import worker

LOG_DIR = Path(paths.LOGS) / "chip_holder"


def serves(workflow: Any, measured: list[str]) -> bool:
    """Whether a run starts a holder for its chip-holding jobs: a local run measuring a
    TPU, unless a holder its caller started (``inherited``) still serves."""
    from casebook.run import off_device

    return (workflow.local_exec and not workflow.remote_exec and hasattr(socket, "send_fds")
            and any(target in off_device.TPU_TARGETS for target in measured)
            and not inherited())


def inherited() -> bool:
    """Whether the environment names a holder still alive (one a TPU window started for
    a step's runs, ``casebook.hosts.gpu_window``): the run's jobs go to it."""
    from casebook.core.errors import gone

    pid = int(os.environ.get(worker.CHIP_HOLDER_PID) or 0)
    return bool(os.environ.get(worker.CHIP_SOCKET)) and pid > 0 and not gone(pid)


def _open_device() -> tuple[str, float]:
    """Open the accelerator jax finds here: its device kind, and the seconds from this
    process's start (what a job in its own process pays: the interpreter, the imports and
    opening the device)."""
    import jax

    from casebook.core import jobprofile

    kind = jax.devices()[0].device_kind
    return kind, time.time() - jobprofile.process_started()


def _run_here(request: dict[str, Any], fds: list[int]) -> int:
    """Run one job in this process with its streams, directory, arguments and
    environment; put this process's own back after it. The job's exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    own_fds = [os.dup(fd) for fd in (0, 1, 2)]
    own_env, own_cwd, own_argv = dict(os.environ), os.getcwd(), list(sys.argv)
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The job's profile counts its own CPU: what its process spent before the handoff,
        # plus this process's CPU from now (jobprofile adds this process's total).
        from casebook.core import jobprofile

        spent = os.times()
        os.environ[jobprofile.JOB_CPU_S] = repr(
            float(request["env"].get(jobprofile.JOB_CPU_S, 0)) - spent.user - spent.system)
        sys.argv = list(request["argv"])
        return worker.run_script(request["script"])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in enumerate(own_fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(own_env)
        os.chdir(own_cwd)
        sys.argv = own_argv
        gc.collect()


def _end_on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def serve(path: str, parent: int, reports: Path = LOG_DIR) -> None:
    """Import everything, open the chip, then run each job sent to ``path``, one at a
    time, until ``parent`` is gone; SIGTERM ends it (and the job it runs). What it cost
    and did goes to ``reports``/<pid>.json."""
    # The holder ends with whoever started it (a run, or a window's step), never with the
    # run of the first job it serves (whose watch, errors.end_with_run, is then a no-op):
    # a step's holder outlives each of its runs.
    os.environ[errors.RUN_PID] = str(parent)
    errors.end_with_run()
    missing = worker.preload()
    if missing:
        sys.stderr.write(f"casebook chip holder: not imported: {', '.join(missing)}\n")
    kind, opened_s = _open_device()  # every import done first, as a job's process does
    # Ended by SIGTERM between jobs (a step's end), it leaves through ``finally`` below,
    # not through the handler the TPU runtime installs on opening the chip (a stack dump in
    # every window log); during a job SIGTERM ends it at once, as the job's own process.
    signal.signal(signal.SIGTERM, _end_on_sigterm)
    summary = {"pid": os.getpid(), "device_kind": kind, "opened_s": round(opened_s, 3),
               "jobs": 0, "failed": 0, "job_s": 0.0}
    report = reports / f"{os.getpid()}.json"
    files.atomic_write_text(report, json.dumps(summary))
    sys.stderr.write(f"casebook chip holder: started and opened {kind} in {opened_s:.1f} s\n")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    listener.settimeout(worker.REAP_S * 10)
    os.replace(path + ".new", path)  # jobs hand over only once the chip is open
    try:
        while os.getppid() == parent:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            with conn:
                received = worker.receive_job(conn)
                if received is None:
                    continue
                request, fds = received
                worker.send_status(conn, os.getpid())  # the process signals are relayed to
                began = time.perf_counter()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a job stopped ends it at once
                try:
                    code = _run_here(request, fds)
                finally:
                    signal.signal(signal.SIGTERM, _end_on_sigterm)
                summary["jobs"] += 1
                summary["failed"] += code != 0
                summary["job_s"] = round(summary["job_s"] + time.perf_counter() - began, 3)
                files.atomic_write_text(report, json.dumps(summary))  # before the job ends
                worker.send_status(conn, code)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sys.stderr.write(f"casebook chip holder: ran {summary['jobs']} jobs\n")


def start(folder: Path, reports: Path = LOG_DIR) -> subprocess.Popen:
    """Start this run's chip holder (its socket in ``folder``, its report in ``reports``)
    and name it in the environment the jobs inherit."""
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / f"chip-{os.getpid()}.sock")
    for stale in (path, path + ".new"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    holder = subprocess.Popen([sys.executable, "-m", "casebook.run.chip_holder", path,
                               str(os.getpid()), str(Path(reports).resolve())],
                              stdin=subprocess.DEVNULL)
    os.environ[worker.CHIP_SOCKET] = path
    os.environ[worker.CHIP_HOLDER_PID] = str(holder.pid)
    return holder


def stop(holder: subprocess.Popen | None) -> None:
    """End the holder ``start`` returned."""
    os.environ.pop(worker.CHIP_SOCKET, None)
    os.environ.pop(worker.CHIP_HOLDER_PID, None)
    worker.end(holder)


def opened(folder: Path = LOG_DIR) -> list[dict[str, Any]]:
    """What each holder that ran here wrote: device kind, seconds to open it, jobs run."""
    found = []
    for report in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(report.read_text()))
    return found


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
