"""One process that has imported jax, the cases and casebook once, forking a child per job.

Every job of a local run started Python and imported jax, the case kernels and casebook:
about 2 s of CPU per job, in each of the ~290 jobs of a cold run. ``start`` (the
workflow's ``onstart``) launches ``serve``, which imports them once; a script's first call,
``fork_from_server(snakemake)``, hands its job to the server, which forks a child that runs
the script with everything already imported. The script's own process stays what
Snakemake waits on: it passes its standard streams to the child, relays signals to it
and exits with its status. Where no server answers (a cluster job, a run that started
none, a server still importing or gone) the script runs in its own process, as before.

The server starts no XLA backend and no thread, so a fork is safe and every child makes
its own backend, sized by its own CPU affinity. Its imports sized numpy's BLAS pool for
one thread, so it serves jobs of one thread, and measurements that pin their process to
one CPU before jax starts a backend (``casebook.measure.pinning``); a job of several
threads otherwise runs in its own process. ``start`` serves a local run of target cpu
alone, whose every job runs on the CPU (the server's ``JAX_PLATFORMS``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import pkgutil
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SOCKET = "CASEBOOK_WORKER_SOCKET"  # where a run's server listens (set by ``start``)
CHIP_SOCKET = "CASEBOOK_CHIP_SOCKET"  # where a run's chip holder listens (casebook.run.chip_holder)
CHIP_HOLDER_PID = "CASEBOOK_CHIP_HOLDER_PID"  # its process, waited for while it opens the chip
HOLDER_WAIT_S = 300.0  # the longest a chip job waits for the holder to open the chip
IN_CHILD = "CASEBOOK_WORKER_CHILD"  # set in a forked child: its script runs there
PRELOADED = ("casebook", "kernels")  # packages imported whole by the server
REAP_S = 0.05  # how often the server looks for children that ended
ONE_THREAD = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
_HEADER = struct.Struct("!Q")
_STATUS = struct.Struct("!i")


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return data


def fork_from_server(job: Any, pins_itself: bool = False) -> None:
    """Run this script's job in a child of the run's server: returns only in that child,
    or where no server answers (then the job runs here); else exits with the child's
    status. ``job``: the script's ``snakemake`` object. A job of several threads runs here
    unless it ``pins_itself`` to one CPU before jax starts (a measurement on target cpu):
    either way its threads run on one CPU, as the server's imports were sized. A job of a
    TPU target that does not hold the chip keeps off it (``off_device.off_the_chip``); one
    that holds it goes to the run's chip holder (``casebook.run.chip_holder``) where one
    serves, which runs it in the process that opened the chip."""
    from casebook.run import off_device

    if os.environ.get(IN_CHILD):
        return
    if not off_device.off_the_chip(job) and off_device.holds_the_chip(job):
        path = os.environ.get(CHIP_SOCKET)
        if path and _holder_ready(path, int(os.environ.get(CHIP_HOLDER_PID, 0))):
            hand_over(path)
        return
    path = os.environ.get(SOCKET)
    if path and (getattr(job, "threads", 1) == 1 or pins_itself):
        hand_over(path)


def _holder_ready(path: str, pid: int) -> bool:
    """Wait while the chip holder ``pid`` is still opening the chip (a job that opened it
    meanwhile in its own process would keep the holder from it): whether it listens on
    ``path``; False once it is gone, or after HOLDER_WAIT_S."""
    from casebook.core.errors import gone

    deadline = time.monotonic() + HOLDER_WAIT_S
    while not os.path.exists(path):
        if not pid or gone(pid) or time.monotonic() > deadline:
            return False
        time.sleep(REAP_S)
    return True


def hand_over(path: str) -> None:
    """Send this script's job (its arguments, directory, environment and standard streams)
    to the server listening on ``path`` and exit with the status of the process that ran
    it, relaying signals to that process; returns where no server answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return
    from casebook.core import jobprofile

    times = os.times()
    env = {**os.environ, IN_CHILD: "1",
           jobprofile.JOB_STARTED: repr(jobprofile.process_started()),
           jobprofile.JOB_CPU_S: repr(times.user + times.system)}
    request = pickle.dumps({"script": os.path.abspath(sys.argv[0]), "argv": sys.argv,
                            "cwd": os.getcwd(), "env": env})
    socket.send_fds(sock, [_HEADER.pack(len(request))], [0, 1, 2])
    sock.sendall(request)
    try:
        (runner,) = _STATUS.unpack(_receive(sock, _STATUS.size))
    except ConnectionError:
        sys.stderr.write("casebook: the server closed before taking the job\n")
        os._exit(1)

    relayed = []

    def relay(signum, _frame):
        relayed.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(runner, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, relay)
    try:
        (status,) = _STATUS.unpack(_receive(sock, _STATUS.size))
    except ConnectionError:  # a process that ran it in-process ended (casebook.run.chip_holder)
        if relayed:
            os._exit(128 + relayed[-1])
        sys.stderr.write(f"casebook: the server ended before the job's process {runner}\n")
        status = 1
    os._exit(status)


def receive_job(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """A job sent by ``hand_over``: its request and its three standard streams' file
    descriptors; None (``conn`` closed) for a request that could not be read."""
    fds: list[int] = []
    try:
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        (size,) = _HEADER.unpack(header)
        request = pickle.loads(_receive(conn, size))
        if len(fds) != 3:
            raise ConnectionError(f"{len(fds)} standard streams passed, not 3")
    except (OSError, ConnectionError, struct.error, pickle.UnpicklingError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    return request, fds


def send_status(conn: socket.socket, value: int) -> None:
    """Tell the job's process a pid or an exit status (nothing if it is gone)."""
    with contextlib.suppress(OSError):
        conn.sendall(_STATUS.pack(value))


def preload() -> list[str]:
    """Import every module of casebook and the case kernels (what jobs import), and
    Snakemake's script module (each script's preamble); the modules left out because a
    package they import is not installed here (a job importing one fails as it would
    in its own process)."""
    import snakemake.script  # noqa: F401

    missing = []
    for name in PRELOADED:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if module.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(module.name)
            except ModuleNotFoundError as error:
                missing.append(f"{module.name} ({error.name})")
    return missing


def fork_safe() -> str | None:
    """Why forking this process would not be safe, or None: a second thread (Python's or a
    library's, e.g. a BLAS pool), or a started XLA backend."""
    import threading

    if "jax" in sys.modules:
        from jax._src import xla_bridge

        if xla_bridge._backends:
            return f"an XLA backend started ({', '.join(xla_bridge._backends)})"
    tasks = Path("/proc/self/task")
    threads = len(os.listdir(tasks)) if tasks.is_dir() else threading.active_count()
    if threads > 1:
        return f"{threads} threads run"
    return None


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """In the fork: become the job's process, run its script; the exit status."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the job's own streams
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    return run_script(request["script"])


def run_script(script: str) -> int:
    """Run a job's ``script`` as ``__main__`` in this process; its exit status, with a
    failure reported on stderr as its own process would."""
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as done:
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        sys.stderr.write(f"{code}\n")
        return 1
    except BaseException:  # the job's failure, reported as its own process would
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(path: str, parent: int) -> None:
    """Import everything, then fork a child per request on ``path`` until ``parent`` is
    gone or SIGTERM arrives; a child whose job's process went away is ended."""
    missing = preload()
    if missing:
        sys.stderr.write(f"casebook worker: not imported: {', '.join(missing)}\n")
    unsafe = fork_safe()
    if unsafe:
        sys.stderr.write(f"casebook worker: not serving: {unsafe}\n")
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.replace(path + ".new", path)  # clients connect only once everything is imported
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    served = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while not stop and os.getppid() == parent:
            for key, _ in selector.select(REAP_S):
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    pid = _fork_job(conn, [listener, *children.values()], selector)
                    if pid is not None:
                        served += 1
                        children[pid] = conn
                        selector.register(conn, selectors.EVENT_READ, pid)
                else:  # a job's process closed: it was killed, so its child ends too
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(key.data, signal.SIGTERM)
                    selector.unregister(key.fileobj)
            _reap(children, selector)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sys.stderr.write(f"casebook worker: served {served} jobs\n")


def _fork_job(conn: socket.socket, others: list[socket.socket],
              selector: selectors.BaseSelector) -> int | None:
    """Fork ``conn``'s job; its pid, or None for a request that could not be read. The
    child closes the server's sockets (``others``) before the job opens any file."""
    received = receive_job(conn)
    if received is None:
        return None
    request, fds = received
    pid = os.fork()
    if pid == 0:  # never returns to the server's loop
        code = 1
        try:
            selector.close()
            for sock in (*others, conn):
                sock.close()
            code = _child(request, fds)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    send_status(conn, pid)  # a job gone already: its EOF ends the child
    return pid


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        send_status(conn, code if code >= 0 else 128 - code)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)
        conn.close()


def serves(workflow: Any, measured: list[str]) -> bool:
    """Whether a run serves its jobs from a worker: a local run of target cpu alone."""
    return (workflow.local_exec and not workflow.remote_exec and measured == ["cpu"]
            and hasattr(os, "fork") and hasattr(socket, "send_fds"))


def start(folder: Path) -> subprocess.Popen:
    """Start this run's server (its socket in ``folder``) and name it in the environment
    the jobs inherit. The server's jax sees the CPU alone, as every job of a cpu run."""
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / f"worker-{os.getpid()}.sock")
    for stale in (path, path + ".new"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    # The libraries that size a thread pool on import (numpy's BLAS) size it as for the
    # one-thread jobs it serves (Snakemake sets these per job from its threads).
    one_thread = dict.fromkeys(ONE_THREAD, "1")
    server = subprocess.Popen([sys.executable, "-m", "casebook.run.worker", path, str(os.getpid())],
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, **one_thread, "JAX_PLATFORMS": "cpu"})
    os.environ[SOCKET] = path
    return server


def stop(server: subprocess.Popen | None) -> None:
    """End the server ``start`` returned (jobs then run in their own processes)."""
    os.environ.pop(SOCKET, None)
    end(server)


def stop_all(servers: list[tuple[Any, subprocess.Popen]]) -> None:
    """Stop each (stop function, process) a run started (its worker, its chip holder),
    the last started first; ``servers`` is left empty."""
    while servers:
        stop_one, process = servers.pop()
        stop_one(process)


def end(process: subprocess.Popen | None) -> None:
    """Terminate a server process, killing it if it has not ended in 10 s."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
