"""The pipeline's own time: a cold run on a clean clone, profiled per rule.

Clones the committed HEAD into a temporary folder and runs ``snakemake --cores N`` there
with this interpreter (the environment exists; installing it is not counted), then reads
each job's profile from the end of its log (``casebook.core.jobprofile``): per rule, the jobs,
their wall and CPU time summed, the median and slowest job, and the median startup
(interpreter, Snakemake's preamble, imports) before a job's work began. The Snakemake
process's own CPU is the run's total less its jobs'. Then a no-op rerun is timed, and a
one-point change: one parameter of one point set in the clone's case config (``--change``),
the rerun's jobs counted per rule; and what the cold run checked, counted from its
records (``checks``), and the host's speed before and after (``host_speed``: runs of the
same code differ with it). The result goes to benchmarks/results/pipeline_time.json, the cases
run named in it (benchmarks/results/pipeline_time_before.json: the run before issue 16).

    .venv/bin/python -m benchmarks.pipeline_time [--cores 2]
        [--config cases=[splash_attention]] [--change CASE:POINT:KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from benchmarks.workloads import repeated_matmul, sample, write
from casebook.core import jobprofile, paths, provenance
from casebook.measure import stopping
from casebook.stages import hostcapture

PROBE_SAMPLES = 300  # of the calibration's workload: about 0.1 s on the 2-core host


def _snakemake(project: Path, cores: int, config: list[str],
               *extra: str) -> tuple[float, float]:
    """Wall seconds of one run, and the CPU seconds of it and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    args = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--quiet", "rules",
            *extra, *(["--config", *config] if config else [])]
    done = subprocess.run(args, cwd=project, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"pipeline_time: the run failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def host_speed() -> float:
    """The host's speed as the run found it: the median seconds of the calibration's
    workload (20 × 64×64 float64 matmul, one thread) over ``PROBE_SAMPLES`` calls. Runs of
    the same code on one machine kind differ with it (a VM's neighbours take memory
    bandwidth and cache), so each run records it before and after."""
    return sample(repeated_matmul(20), stopping.FixedCount(PROBE_SAMPLES),
                  warmup_calls=20)["median_s"]


def change_point(project: Path, change: str) -> None:
    """Set ``case:point:key=value`` (value read as YAML) in the clone's case config."""
    case, point, assignment = change.split(":", 2)
    key, value = assignment.split("=", 1)
    path = project / "configs" / "cases" / f"{case}.yaml"
    spec = yaml.safe_load(path.read_text())
    entry = next(p for p in [*spec["points"], *spec.get("build_only_points", [])]
                 if p["name"] == point)
    entry["params"][key] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def jobs_planned(project: Path, config: list[str]) -> dict[str, int]:
    """The jobs a run would make now, per rule (``snakemake -n``'s job stats)."""
    args = [sys.executable, "-m", "snakemake", "-n", "--quiet", "rules",
            *(["--config", *config] if config else [])]
    done = subprocess.run(args, cwd=project, capture_output=True, text=True, check=True)
    counts = {}
    for text in (done.stdout + done.stderr).splitlines():
        parts = text.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] not in ("total", "job"):
            counts[parts[0]] = int(parts[1])
    return counts


def checks(results: Path) -> dict[str, int]:
    """What the run checked, counted from its records under ``results`` (its target's
    folder: committed records of other targets are not the run's): so that a faster run
    can be shown to check no less (every lowering, kernel check, race-detected run,
    mutant, guard)."""
    def load(pattern: str) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(results.glob(pattern))]

    lowerings = load("*/build/*/*.json")
    lowerings += [one for r in load(f"*/build/*{paths.BUILD_ONLY_SUFFIX}")
                  for one in r["lowerings"]]
    verified = load("*/verify/*/*.json")
    trials = [c for r in verified for c in r["checks"]]
    power = load("*/check_power/*.json")
    timed = [r for r in [*load("*/time/*/*.json"), *load("*/baseline/*/*.json")]
             if r["timed"]]
    return {
        "lowerings": len(lowerings),
        "lowerings_built": sum(r["built"]["ok"] for r in lowerings),
        "verify_records": len(verified),
        "verify_ran": sum(r["ran"] for r in verified),
        "verify_passed": sum(r["passed"] for r in verified),
        "kernel_checks": len(trials),
        "race_detected_checks": sum(c["execution"]["race_detection"] for c in trials
                                    if "execution" in c),
        "poisoned_checks": sum(c["execution"]["poisoned"] for c in trials
                               if "execution" in c),
        "mutants_applied": sum(m["applicable"] for r in power for m in r["mutants"]),
        "mutants_caught": sum(m["caught"] for r in power for m in r["mutants"]),
        "measurements": len(timed),
        "guards_passed": sum(len(r["measurement"]["guards"]) for r in timed),
    }


def _host_target() -> str:
    """The target a run with ``target: auto`` measures on this host."""
    return hostcapture.device_class(hostcapture.gpu_facts()[0])


def profiles(logs: Path) -> list[dict[str, Any]]:
    """Every job's profile, from the end of its log."""
    return [p for log in sorted(logs.rglob("*.log")) if (p := jobprofile.read(log)) is not None]


def occupancy(found: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """How the run used its cores, second by second from its first job's start to its last
    job's end: core-seconds no job held (nothing was ready: the critical path), split by
    the rules of the jobs running then; and the seconds measurements held every core."""
    spans = [(p["ended_at"] - p["startup_s"] - p["work_s"], p["ended_at"],
              min(p["threads"], cores), p["rule"]) for p in found]
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    idle = 0.0
    idle_beside: dict[str, float] = defaultdict(float)
    for second in range(int(end - start) + 1):
        t0, t1 = start + second, min(start + second + 1, end)
        running = [(min(b, t1) - max(a, t0), slots, rule) for a, b, slots, rule in spans
                   if a < t1 and b > t0]
        free = (t1 - t0) * cores - sum(share * slots for share, slots, _ in running)
        if free <= 0:
            continue
        idle += free
        for share, _, rule in running:
            idle_beside[rule] += free * share / sum(r[0] for r in running)
    return {
        "span_s": round(end - start, 1),
        "idle_core_s": round(idle, 1),
        "idle_core_s_beside": {r: round(v, 1) for r, v in
                               sorted(idle_beside.items(), key=lambda kv: -kv[1])},
        "all_cores_held_s": round(sum(b - a for a, b, slots, _ in spans if slots >= cores), 1),
    }


def by_rule(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each rule's jobs, from their profiles."""
    jobs = defaultdict(list)
    for profile in found:
        jobs[profile["rule"]].append(profile)
    out = {}
    for rule, profiles in sorted(jobs.items(), key=lambda kv: -sum(p["cpu_s"] for p in kv[1])):
        walls = [p["startup_s"] + p["work_s"] for p in profiles]
        slowest = max(profiles, key=lambda p: p["startup_s"] + p["work_s"])
        out[rule] = {
            "jobs": len(profiles),
            "wall_s": round(sum(walls), 1),
            "cpu_s": round(sum(p["cpu_s"] for p in profiles), 1),
            "startup_s": round(sum(p["startup_s"] for p in profiles), 1),
            "median_wall_s": round(statistics.median(walls), 2),
            "median_startup_s": round(statistics.median(p["startup_s"] for p in profiles), 2),
            "max_wall_s": round(max(walls), 2),
            "max_rss_mib": max(p["max_rss_mib"] for p in profiles),
            "slowest_startup_s": slowest["startup_s"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--config", nargs="*", default=[],
                        help="KEY=VALUE overrides passed to snakemake --config")
    parser.add_argument("--change", default="splash_attention:packed_softcap_f16:soft_cap=2.5",
                        help="the one-point change timed after the no-op rerun")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipeline-time-") as scratch:
        project = Path(scratch) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(paths.SOURCE_ROOT), str(project)],
                       check=True)
        probe_before = host_speed()
        cold_wall, cold_cpu = _snakemake(project, args.cores, args.config)
        noop_wall, _ = _snakemake(project, args.cores, args.config)
        found = profiles(project / paths.LOGS)
        rules = by_rule(found)
        used = occupancy(found, args.cores)
        checked = checks(project / paths.target_dir(_host_target()))
        change_point(project, args.change)
        rerun_jobs = jobs_planned(project, args.config)
        change_wall, change_cpu = _snakemake(project, args.cores, args.config)
        probe_after = host_speed()
    jobs_cpu = sum(r["cpu_s"] for r in rules.values())
    result = {
        "commit": provenance.commit(),
        "cores": args.cores,
        "cpu_count": os.cpu_count(),
        "host_probe_s": {"before": probe_before, "after": probe_after},
        "config": args.config,
        "cold_run": {"wall_s": round(cold_wall, 1), "cpu_s": round(cold_cpu, 1),
                     "jobs": sum(r["jobs"] for r in rules.values()),
                     "jobs_cpu_s": round(jobs_cpu, 1),
                     "startup_s": round(sum(r["startup_s"] for r in rules.values()), 1),
                     "snakemake_cpu_s": round(cold_cpu - jobs_cpu, 1),
                     "cores": used},
        "noop_rerun_wall_s": round(noop_wall, 2),
        "one_point_change": {"change": args.change, "wall_s": round(change_wall, 1),
                             "cpu_s": round(change_cpu, 1), "jobs": rerun_jobs},
        "by_rule": rules,
        "checks": checked,
    }
    print(f"cold run: {cold_wall:.0f} s wall, {cold_cpu:.0f} CPU-s "
          f"({result['cold_run']['jobs']} jobs; Snakemake itself "
          f"{result['cold_run']['snakemake_cpu_s']:.0f} CPU-s); no-op rerun {noop_wall:.1f} s;"
          f" one-point change {change_wall:.0f} s ({json.dumps(rerun_jobs)})")
    for rule, r in rules.items():
        print(f"  {rule:12} {r['jobs']:4} jobs  {r['cpu_s']:8.1f} CPU-s  "
              f"median {r['median_wall_s']:6.1f} s (startup {r['median_startup_s']:.1f} s)  "
              f"max {r['max_wall_s']:6.1f} s")
    print("cores:", json.dumps(used))
    print(f"host probe (calibration workload median): {probe_before * 1e6:.1f} µs before, "
          f"{probe_after * 1e6:.1f} µs after")
    print("checked:", json.dumps(checked))
    print(write("pipeline_time", result))


if __name__ == "__main__":
    main()
