"""Snakemake logger plugin ``casebook``: a progress line per stage.

Snakemake prints "41 of 151 steps (27%) done"; it does not say which stages those steps
belong to, nor which job the run is waiting on. This plugin (``--logger casebook``, set in
both of casebook's profiles) prints one more line to stderr after every finished job, and
every ``--logger-casebook-interval`` seconds while jobs run and nothing finishes:

    casebook: 41/151 jobs · lower 20/40 · verify 9/30 · time 0/8 · … | 2 running, slowest:
    verify cpu/02_splash_attention/mgpu/s384 for 3 min 12 s

Stages are the workflow's rules, in the order Snakemake lists them; a checkpoint that adds
jobs later raises a stage's total. The lines go through Snakemake's own logger, so they land
whole between its messages, on stderr and in its log file; none of Snakemake's lines
change. It imports nothing from casebook: Snakemake loads it before it reads the Snakefile.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase


@dataclasses.dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    interval: int = dataclasses.field(default=60, metadata={
        "help": "Seconds between progress lines while jobs run and none finishes "
                "(0: only after a job finishes).",
        "type": int})


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 12 s``, ``1 h 05 min``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """Jobs done and planned per stage, and the jobs running with when each started."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.rule_of: dict[int, str] = {}
        self.running: dict[int, tuple[str, float]] = {}  # job id -> (label, start)

    def planned(self, counts: dict[str, int]) -> None:
        """The job count of each rule, from Snakemake's job stats."""
        for rule, count in counts.items():
            if rule != "total":
                self.total[rule] = max(count, self.total.get(rule, 0))

    def started(self, jobid: int, rule: str, wildcards: dict[str, str], now: float) -> None:
        self.rule_of[jobid] = rule
        self.total[rule] = max(self.total.get(rule, 0),
                               self.done.get(rule, 0) + self._running(rule) + 1)
        label = " ".join([rule, "/".join(str(v) for v in wildcards.values())]).strip()
        self.running[jobid] = (label, now)

    def finished(self, jobid: int) -> None:
        self.running.pop(jobid, None)
        rule = self.rule_of.get(jobid)
        if rule is not None:
            self.done[rule] = self.done.get(rule, 0) + 1

    def _running(self, rule: str) -> int:
        return sum(self.rule_of[j] == rule for j in self.running)

    def line(self, now: float) -> str:
        done, total = sum(self.done.values()), sum(self.total.values())
        stages = [f"{rule} {self.done.get(rule, 0)}/{n}" for rule, n in self.total.items()]
        text = " · ".join([f"casebook: {done}/{total} jobs", *stages])
        if self.running:
            label, start = min(self.running.values(), key=lambda job: job[1])
            text += (f" | {len(self.running)} running, slowest: {label} for "
                     f"{duration(now - start)}")
        return text


# Snakemake's logger: its stream handler writes a message under a lock, so a line logged
# here never lands inside one of Snakemake's (this handler runs on another thread). The
# line comes back to this handler without an event, and is ignored.
SNAKEMAKE_LOGGER = logging.getLogger("snakemake.logging")


class LogHandler(LogHandlerBase):
    """Logs :class:`Progress` lines beside Snakemake's own messages (not instead of them)."""

    def __post_init__(self) -> None:
        self.progress = Progress()
        self.guard = threading.Lock()
        self.last_line = time.monotonic()
        self.stop = threading.Event()
        interval = self.settings.interval if self.settings is not None else 60
        if interval < 0:
            raise ValueError(f"--logger-casebook-interval must be >= 0, got {interval}")
        quiet = {str(q).lower() for q in self.common_settings.quiet or ()}
        self.silent = bool(self.common_settings.dryrun or quiet & {"all", "progress"})
        if interval and not self.silent:
            threading.Thread(target=self._heartbeat, args=(interval,), daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        event, now = getattr(record, "event", None), time.monotonic()
        with self.guard:
            if event == LogEvent.RUN_INFO:
                self.progress.planned(record.stats)
            elif event == LogEvent.JOB_INFO:
                self.progress.started(record.jobid, record.rule_name, record.wildcards, now)
            elif event == LogEvent.JOB_FINISHED:
                self.progress.finished(record.job_id)
            elif event == LogEvent.PROGRESS:
                self._print(now)

    def _heartbeat(self, interval: int) -> None:
        while not self.stop.wait(min(interval, 5)):
            now = time.monotonic()
            with self.guard:
                if self.progress.running and now - self.last_line >= interval:
                    self._print(now)

    def _print(self, now: float) -> None:
        self.last_line = now
        if not self.silent:
            SNAKEMAKE_LOGGER.info(self.progress.line(now))

    def close(self) -> None:
        self.stop.set()
        super().close()

    # Snakemake's stream handler writes the lines: this one writes to no stream itself,
    # and Snakemake keeps its default handler only when no plugin claims the stream.
    @property
    def writes_to_stream(self) -> bool:
        return False

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
