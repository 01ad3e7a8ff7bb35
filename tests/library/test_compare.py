"""The compare stage: a point's kernel and baseline measured interleaved, the speedup the
median of the per-round ratios, judged against the paired floor; pairs of two kinds of
execution are listed, never measured."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from casebook.core import cases, records
from casebook.core.errors import CasebookError
from casebook.stages import timing
from tests.projects import MEASUREMENT, tiny_case

pytestmark = [pytest.mark.timeout(300), pytest.mark.host_rehearsal]
CASE = "splash_attention"
NATIVE = {"mode": "XLA", "interpret": False, "poisoned": False, "race_detection": False}
INTERPRETED = {**NATIVE, "interpret": True}


def floor_record(path, paired: float) -> str:
    records.write(str(path), "noise_floor", {
        "target": "cpu", "workload": "test", "stop_criterion": "fixed_count",
        "stop_target": 0.01, "rounds": 4, "quantile": 0.95, "ratios": [1.0, 1.1, 0.9, 1.0],
        "median_s": 1e-3, "noise_floor": 0.25, "clock": "host", "clock_kind": "host",
        "cache": {"mode": "hot", "description": "test"}, "repeats": 1, "pinned_cpu": None,
        "paired": {"rounds": 4, "quantile": 0.95, "ratios": [1.0, 1.01, 0.99, 1.0],
                   "median_s": 1e-3, "samples_per_series": 10, "noise_floor": paired}})
    return str(path)


@pytest.fixture
def point(tmp_path, monkeypatch):
    """A one-point case whose "kernel" is the dense_masked baseline called twice (native
    XLA: twice the work of the baseline it is compared with)."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / f"{CASE}.yaml").write_text(yaml.safe_dump(tiny_case()))
    plugin = cases.load(CASE)

    def kernel(variant, params, purpose, build_dir=None):
        base = plugin.baseline("dense_masked", params, build_dir=build_dir)
        return base._replace(call=lambda *args: (base.call(*args), base.call(*args))[1])

    monkeypatch.setattr(plugin, "kernel", kernel)
    name = tiny_case()["points"][0]["name"]
    times = {"mgpu": {"timed": True, "execution": NATIVE},
             "upstream": {"timed": True, "execution": INTERPRETED}}
    pairs = [{"variant": "mgpu", "baseline": "dense_masked"},
             {"variant": "upstream", "baseline": "dense_masked",
              "why_not": "not compared: upstream ran as interpreted kernel"}]
    return timing.PointComparison(str(tmp_path / "cases"), CASE, name, "cpu", pairs, times)


def test_twice_the_work_measured_interleaved_reads_slower_by_half(point, tmp_path):
    floor = floor_record(tmp_path / "floor.json", paired=0.05)
    out, samples = str(tmp_path / "compare.json"), str(tmp_path / "compare.samples.csv")
    # At least 20 rounds: the 90% interval of the median ratio then leaves out the 5 most
    # extreme rounds on either side (order statistics), so a few rounds with a preempted
    # sample on a loaded host move neither the verdict nor the median; with 5 rounds the
    # interval is the rounds' whole range, and one stalled sample sets it.
    record = timing.compare_point(point, {**MEASUREMENT, "min_samples": 20}, floor, out,
                                  samples)
    assert records.read(out, "compare") == record and record["measured"]
    measured, listed = record["pairs"]
    assert listed == point.pairs[1]  # carried, never measured
    assert measured["design"] == "paired" and measured["noise_floor"] == 0.05
    assert measured["verdict"] == "SLOWER" and measured["printable"]
    # Twice the calls, not twice the sample: each sample's own costs (the wait and the
    # fetch around the call) are paid once, so the median ratio lands at or a little
    # above 1/2; the interval's ends are the load's, not the work's.
    assert measured["speedup_ci_low"] <= measured["speedup"] <= measured["speedup_ci_high"]
    assert 0.4 < measured["speedup"] < 0.7
    rows = list(csv.DictReader(Path(samples).read_text().splitlines()))
    assert {r["subject"] for r in rows} == {"variant mgpu", "baseline dense_masked"}
    by_subject = {s: [int(r["round"]) for r in rows if r["subject"] == s]
                  for s in ("variant mgpu", "baseline dense_masked")}
    assert by_subject["variant mgpu"] == by_subject["baseline dense_masked"]
    assert len(by_subject["variant mgpu"]) == measured["rounds"] >= 20
    for name, summary in record["measurement"].items():
        assert summary["samples"] == len(by_subject[name])


def test_nothing_comparable_measures_nothing_and_says_why(point, tmp_path):
    floor = floor_record(tmp_path / "floor.json", paired=0.05)
    only_listed = timing.PointComparison(point.case_dir, CASE, point.point, "cpu",
                                         point.pairs[1:], point.times)
    assert not only_listed.stands_in
    out, samples = str(tmp_path / "c.json"), str(tmp_path / "c.samples.csv")
    record = timing.compare_point(only_listed, MEASUREMENT, floor, out, samples)
    assert not record["measured"] and record["pairs"] == point.pairs[1:]
    assert Path(samples).read_text().splitlines() == [
        "subject,round,sample,input_set,seconds,host_seconds,kernel_seconds,"
        "launch_overhead_seconds,kernels,unseen_seconds,sm_clock_mhz,clock_event_reasons,"
        "discarded"]


def test_pairs_are_like_with_like_and_of_one_kind_of_execution():
    verified = {"fwd": {"checks": [{"outputs": {"out": {}}}]},
                "bwd": {"checks": [{"outputs": {"dq": {}, "dk": {}}}]},
                "slow": {"checks": [{"outputs": {"out": {}}}]},
                "failed": {"checks": [{"outputs": {"out": {}}}]}}
    times = {"fwd": {"timed": True, "execution": NATIVE},
             "bwd": {"timed": True, "execution": NATIVE},
             "slow": {"timed": True, "execution": INTERPRETED},
             "failed": {"timed": False}}
    bases = {"xla": {"timed": True, "execution": NATIVE, "check": {"outputs": {"out": {}}}},
             "gpu_only": {"timed": False}}
    pairs = timing.comparable(times, verified, bases, gpus=[])
    assert pairs[0] == {"variant": "fwd", "baseline": "xla"}
    (slow,) = pairs[1:]
    assert (slow["variant"], slow["baseline"]) == ("slow", "xla")
    assert slow["why_not"] == ("not compared: slow ran as interpreted kernel, xla as XLA on "
                               "the host CPU; their host times are not one kind of speed")
    compared = timing.PointComparison("c", CASE, "p", "cpu", pairs, times)
    assert not compared.stands_in  # the interpreted kernel is not measured: pinned
    assert timing.PointComparison("c", CASE, "p", "cpu", [{"variant": "slow",
                                  "baseline": "xla"}], times).stands_in


def test_a_floor_record_without_its_paired_floor_is_refused(point, tmp_path):
    floor = floor_record(tmp_path / "floor.json", paired=0.05)
    Path(floor).write_text(Path(floor).read_text().replace('"paired"', '"unpaired"'))
    with pytest.raises(CasebookError, match=r"floor\.json"):
        timing.compare_point(point, MEASUREMENT, floor, str(tmp_path / "c.json"),
                             str(tmp_path / "c.samples.csv"))


def test_a_series_faster_than_its_speed_of_light_refuses_the_comparison(
        point, tmp_path, monkeypatch):
    """As on a GPU target: every series is held to its bound; one "faster than physics"
    (a bound of an hour) refuses the whole comparison, its samples kept."""
    from casebook.core import speed_of_light

    def bound(plugin, params, outputs, target, measured=None):
        return {**speed_of_light.bound({"flops": 1, "bytes": 1, "math": "bf16",
                                        "basis": "test"}, "h200"), "bound_s": 3600.0}

    monkeypatch.setattr(speed_of_light, "for_target", bound)
    floor = floor_record(tmp_path / "floor.json", paired=0.05)
    out, samples = str(tmp_path / "compare.json"), str(tmp_path / "compare.samples.csv")
    record = timing.compare_point(point, MEASUREMENT, floor, out, samples)
    assert not record["measured"]
    assert record["not_measured_reason"].startswith(f"{records.REFUSED}: variant mgpu: "
                                                    "impossible: median")
    assert "baseline dense_masked: impossible" in record["not_measured_reason"]
    assert all(p["why_not"] for p in record["pairs"])
    assert len(Path(samples).read_text().splitlines()) > 5  # the evidence is kept
