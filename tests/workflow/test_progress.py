"""The progress line per stage (Snakemake logger plugin ``casebook``): its counts, its
slowest job, its heartbeat, and its silence where Snakemake is asked to be quiet."""

from __future__ import annotations

import logging
import time

import pytest
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.tests import MockOutputSettings, TestLogHandlerBase

import snakemake_logger_plugin_casebook as plugin


def record(event: LogEvent, **extra) -> logging.LogRecord:
    made = logging.LogRecord("snakemake", logging.INFO, "test.py", 1, "", (), None)
    made.event = event
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def handler(interval: int = 0, **common) -> plugin.LogHandler:
    settings = MockOutputSettings()
    for key, value in common.items():
        setattr(settings, key, value)
    return plugin.LogHandler(settings, plugin.LogHandlerSettings(interval=interval))


class TestInterface(TestLogHandlerBase):
    """Snakemake's own conformance tests for a logger plugin."""

    __test__ = True

    def get_log_handler_cls(self):
        return plugin.LogHandler

    def get_log_handler_settings(self):
        return plugin.LogHandlerSettings(interval=0)


def test_counts_per_stage_and_the_slowest_job():
    progress = plugin.Progress()
    progress.planned({"lower": 3, "verify": 2, "total": 5})
    progress.started(1, "lower", {"case": "c1", "point": "p1"}, now=100.0)
    progress.started(2, "lower", {"case": "c1", "point": "p2"}, now=130.0)
    progress.finished(2)
    line = progress.line(now=230.0)
    assert line.startswith("casebook: 1/5 jobs · lower 1/3 · verify 0/2 | 1 running")
    assert line.endswith("slowest: lower c1/p1 for 2 min 10 s")
    progress.started(3, "lower", {"case": "c1", "point": "p3"}, now=231.0)
    assert "slowest: lower c1/p1 for" in progress.line(now=232.0)  # the earliest start
    for job in (1, 3):
        progress.finished(job)
    assert progress.line(now=240.0) == "casebook: 3/5 jobs · lower 3/3 · verify 0/2"


def test_a_checkpoint_that_adds_jobs_raises_the_stage_total():
    progress = plugin.Progress()
    progress.planned({"page": 1, "total": 1})
    progress.started(7, "page", {"case": "a"}, now=0.0)
    progress.started(8, "page", {"case": "b"}, now=0.0)  # added after the checkpoint
    progress.started(9, "index", {}, now=0.0)  # a rule the plan did not list
    assert progress.line(now=1.0).startswith("casebook: 0/3 jobs · page 0/2 · index 0/1")
    progress.planned({"page": 1, "total": 1})  # a later, smaller plan lowers nothing
    assert "page 0/2" in progress.line(now=1.0)


def test_a_finished_job_never_seen_starting_counts_nowhere():
    progress = plugin.Progress()
    progress.planned({"verify": 1})
    progress.finished(42)
    assert progress.line(now=0.0) == "casebook: 0/1 jobs · verify 0/1"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (59.9, "59 s"), (60, "1 min 0 s"), (3599, "59 min 59 s"),
    (3600, "1 h 00 min"), (7322, "2 h 02 min")])
def test_duration(seconds, text):
    assert plugin.duration(seconds) == text


def lines(caplog) -> list[str]:
    """The progress lines logged through Snakemake's logger since the last call."""
    found = [r.getMessage() for r in caplog.records if r.name == "snakemake.logging"]
    caplog.clear()
    return found


def test_a_line_after_each_finished_job(caplog):
    caplog.set_level(logging.INFO, "snakemake.logging")
    log = handler()
    log.emit(record(LogEvent.RUN_INFO, stats={"verify": 2, "total": 2}))
    log.emit(record(LogEvent.JOB_INFO, jobid=5, rule_name="verify",
                    wildcards={"target": "cpu", "case": "c"}))
    assert lines(caplog) == []  # a start alone says nothing
    log.emit(record(LogEvent.JOB_FINISHED, job_id=5))
    log.emit(record(LogEvent.PROGRESS, done=1, total=2))
    assert lines(caplog) == ["casebook: 1/2 jobs · verify 1/2"]
    log.emit(record(None))  # the line itself, back through Snakemake's logger
    assert lines(caplog) == []
    log.close()


@pytest.mark.parametrize("common", [{"dryrun": True}, {"quiet": {"progress"}},
                                    {"quiet": {"all"}}])
def test_silent_in_a_dry_run_or_when_quiet(caplog, common):
    caplog.set_level(logging.INFO, "snakemake.logging")
    log = handler(interval=1, **common)
    log.emit(record(LogEvent.JOB_INFO, jobid=1, rule_name="time", wildcards={}))
    log.emit(record(LogEvent.PROGRESS, done=0, total=1))
    time.sleep(1.5)
    assert lines(caplog) == []
    log.close()


def test_a_heartbeat_while_a_job_runs_and_none_finishes(caplog):
    caplog.set_level(logging.INFO, "snakemake.logging")
    log = handler(interval=1)
    time.sleep(1.5)
    assert lines(caplog) == []  # nothing running: nothing to say
    log.emit(record(LogEvent.JOB_INFO, jobid=1, rule_name="time",
                    wildcards={"case": "c", "point": "p"}))
    deadline = time.monotonic() + 30  # a 1 s heartbeat: 30 of them under load
    while not (said := lines(caplog)):
        assert time.monotonic() < deadline, "no heartbeat line in 30 s"
        time.sleep(0.2)
    assert said[0].startswith("casebook: 0/1 jobs · time 0/1 | 1 running, slowest: time c/p")
    log.close()


def test_a_negative_interval_is_refused():
    with pytest.raises(ValueError, match="--logger-casebook-interval must be >= 0"):
        handler(interval=-1)
