"""The pipeline benchmark's reading of job profiles: where a run left cores idle."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks import pipeline_time
from benchmarks.pipeline_time import occupancy
from casebook.core import jobprofile


def job(rule: str, start: float, seconds: float, threads: int = 1) -> dict:
    return {"rule": rule, "ended_at": start + seconds, "startup_s": 0.5,
            "work_s": seconds - 0.5, "threads": threads}


def test_idle_cores_are_counted_and_laid_to_the_jobs_running_then():
    found = [job("noise_floor", 100, 10, threads=2),  # both cores: no idle core
             job("lower", 110, 4), job("verify", 110, 8),  # 4 s together, 4 s alone
             job("time", 118, 2, threads=1)]  # alone at the tail
    used = occupancy(found, cores=2)
    assert used["span_s"] == 20
    assert used["idle_core_s"] == pytest.approx(6)
    assert used["idle_core_s_beside"] == {"verify": 4, "time": 2}
    assert used["all_cores_held_s"] == 10


def test_a_jobs_profile_says_its_cores_and_when_it_ended():
    before = time.time()
    profile = json.loads(jobprofile.line("verify", before, threads=3)
                         .removeprefix(jobprofile.PREFIX))
    assert profile["threads"] == 3
    assert before - 0.001 <= profile["ended_at"] <= time.time() + 0.001  # to the ms


def test_the_host_probe_is_the_median_of_the_calibration_workload(monkeypatch):
    """The probe samples the calibration's workload (20 matmuls a call) PROBE_SAMPLES
    times after a warm-up, and is its median: no timing asserted here."""
    seen = {}

    def fake_sample(workload, criterion, warmup_calls=0):
        seen.update(workload=workload, criterion=criterion, warmup_calls=warmup_calls)
        return {"median_s": 1.25e-4}

    made = []
    monkeypatch.setattr(pipeline_time, "sample", fake_sample)
    monkeypatch.setattr(pipeline_time, "repeated_matmul",
                        lambda reps: made.append(reps) or f"workload of {reps}")
    assert pipeline_time.host_speed() == 1.25e-4
    assert made == [20] and seen["workload"] == "workload of 20"
    assert seen["criterion"].count == pipeline_time.PROBE_SAMPLES and seen["warmup_calls"] > 0
