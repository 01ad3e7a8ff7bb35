"""A real single-node SLURM for the tests: installed when missing, started, stopped by PID.

One node (``localhost``) in two partitions: ``debug`` (the default, no GPU) and ``gpu``,
whose GPU is a stand-in gres backed by ``/dev/null`` and whose node carries the feature
``standin``. Every file lives in a scratch folder except ``/etc/slurm/slurm.conf``, a
symlink, because the jobs' ``srun`` steps run with the SLURM_* variables stripped and read
the default path. A munged already running is used, never stopped; the daemons started
here run in the foreground, so they are stopped by their own process ids.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MUNGE_RUN = Path("/run/munge")
MARKER = "casebook-slurm"  # part of the scratch path: names a symlink as ours
FEATURE = "standin"
# A node is idle in about 4 s; 60 s leaves room on a loaded 2-core machine.
START_TIMEOUT_S = 60


class Unavailable(Exception):
    """This machine cannot run SLURM; the message says why."""


def install() -> None:
    """Install slurm-wlm and munge with apt-get unless their daemons are already here."""
    if all(shutil.which(d) or Path("/usr/sbin", d).exists()
           for d in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("slurm-wlm and munge are not installed, and installing them needs "
                          "root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", *PACKAGES]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode:
            raise Unavailable(f"{' '.join(command)} failed: {done.stderr[-2000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            # Below the total: slurmd drains a node whose RealMemory exceeds what it finds.
            return int(line.split()[1]) // 1024 * 8 // 10
    raise Unavailable("no MemTotal in /proc/meminfo")


def slurm_conf(scratch: Path, cpus: int, memory_mb: int) -> str:
    return f"""\
ClusterName=casebook
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation={scratch}/state
SlurmdSpoolDir={scratch}/spool
SlurmctldPidFile={scratch}/slurmctld.pid
SlurmdPidFile={scratch}/slurmd.pid
SlurmctldLogFile={scratch}/slurmctld.log
SlurmdLogFile={scratch}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# The completion trace the tests read: one line per finished job, with its partition.
JobCompType=jobcomp/filetxt
JobCompLoc={scratch}/jobcomp.log
# Finished jobs stay visible to squeue/scontrol for the whole test.
MinJobAge=3600
ReturnToService=2
GresTypes=gpu
NodeName=localhost CPUs={cpus} RealMemory={memory_mb} Gres=gpu:1 Feature={FEATURE} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """Start with ``start()``; ``stop()`` ends every daemon started here, whatever happened."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.started: dict[str, subprocess.Popen] = {}

    @property
    def jobcomp_log(self) -> Path:
        return self.scratch / "jobcomp.log"

    def start(self) -> None:
        install()
        if os.geteuid() != 0:
            raise Unavailable("slurmd and slurmctld run as root here (SlurmUser=root)")
        if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
            if not (SYSTEM_CONF.is_symlink() and MARKER in os.readlink(SYSTEM_CONF)):
                raise Unavailable(f"{SYSTEM_CONF} already configures a SLURM; not replaced")
            if _running(Path(os.readlink(SYSTEM_CONF)).parent / "slurmctld.pid"):
                raise Unavailable(f"another test run's SLURM is running ({SYSTEM_CONF})")
            SYSTEM_CONF.unlink()  # left by an earlier run that was killed
        for sub in ("state", "spool"):
            (self.scratch / sub).mkdir(parents=True)
        (self.scratch / "slurm.conf").write_text(
            slurm_conf(self.scratch, os.cpu_count() or 1, _memory_mb()))
        (self.scratch / "gres.conf").write_text("NodeName=localhost Name=gpu File=/dev/null\n")
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        (SYSTEM_CONF.parent / "gres.conf").unlink(missing_ok=True)
        SYSTEM_CONF.symlink_to(self.scratch / "slurm.conf")
        (SYSTEM_CONF.parent / "gres.conf").symlink_to(self.scratch / "gres.conf")
        self._start_munge()
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i"])
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-D", "-N", "localhost"])
        self._wait_idle()

    def _start_munge(self) -> None:
        if self._munge_works():
            return
        MUNGE_RUN.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_RUN, "munge", "munge")
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/mungekey", "--create"],
                           check=True, capture_output=True, timeout=30)
        self._spawn("munged", ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "-F"])
        deadline = time.monotonic() + 10
        while not self._munge_works():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not answer: {self._log('munged')}")
            time.sleep(0.2)

    @staticmethod
    def _munge_works() -> bool:
        token = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        return token.returncode == 0 and subprocess.run(
            ["unmunge"], input=token.stdout, capture_output=True, timeout=10).returncode == 0

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = (self.scratch / f"{name}.out").open("wb")
        self.started[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)

    def _log(self, name: str) -> str:
        files = [self.scratch / f"{name}.out", self.scratch / f"{name}.log"]
        return "\n".join(f.read_text()[-2000:] for f in files if f.exists())

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            for name, process in self.started.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited ({process.returncode}):\n{self._log(name)}")
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                                  text=True, timeout=10)
            state = done.stdout.strip()
            if done.returncode == 0 and state and all(s == "idle" for s in state.split()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"node not idle after {START_TIMEOUT_S} s (state {state!r}):\n"
                           f"{self._log('slurmctld')}\n{self._log('slurmd')}")

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still knows, as ``scontrol show job -o`` fields."""
        done = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True,
                              text=True, check=True, timeout=30)
        return [_fields(line) for line in done.stdout.splitlines()
                if line.startswith("JobId=")]

    def completions(self) -> list[dict[str, str]]:
        """The jobcomp trace: one record per finished job."""
        text = self.jobcomp_log.read_text() if self.jobcomp_log.exists() else ""
        return [_fields(line) for line in text.splitlines() if line.strip()]

    def stop(self) -> None:
        """Cancel what is left, then end each daemon started here, newest first."""
        if "slurmctld" in self.started and self.started["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True,
                           timeout=30)
        for name in reversed(list(self.started)):
            process = self.started[name]
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=15)
        for conf in (SYSTEM_CONF, SYSTEM_CONF.parent / "gres.conf"):
            if conf.is_symlink() and MARKER in os.readlink(conf):
                conf.unlink()

    def alive(self) -> list[str]:
        return [name for name, p in self.started.items() if p.poll() is None]


def _running(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _fields(line: str) -> dict[str, str]:
    """``Key=value Key2=value`` pairs (values without spaces, as scontrol -o writes them)."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)
