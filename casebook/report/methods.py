"""Facts for the methods page, read from records, case configs and the code that acts.

Nothing here is a typed number: tolerances come from case configs, the timing protocol
from the run's config, clocks and oracles from the modules that use them, and noise
from the records. A host without an A/A noise-floor record is said to have none.
"""

from __future__ import annotations

import inspect
import json
import statistics
from pathlib import Path
from typing import Any

from casebook.core import config, paths, records, speed_of_light
from casebook.core.errors import CasebookError
from casebook.measure import clocks, engine, guards, pinning, stats, stopping
from casebook.report import conditions, history
from casebook.report.evidence import Evidence
from casebook.stages import verify

# Every module whose docstrings this page quotes; the methods rule declares their files
# (``paths.METHODS_QUOTES``), so editing a rule's docstring re-renders the page.
QUOTED = (verify, clocks, engine, guards, pinning, stats, stopping, speed_of_light, history)


def doc(function: Any) -> str:
    """A function's own docstring: the rule as the code states it."""
    return inspect.getdoc(function) or ""


def verification_rules() -> dict[str, str]:
    return {"oracle": verify.ORACLE, "comparison": doc(verify.compare),
            "seed": doc(verify.draw_seed)}


def measurement_rules() -> dict[str, str]:
    return {"clock": "\n".join(f"{c.__name__}: {doc(c)}" for c in (
                clocks.HostClock, clocks.CudaEventClock, clocks.CuptiKernelClock) if doc(c)),
            "protocol": doc(engine.measure),
            "stopping": "\n\n".join(f"{c.__name__}: {doc(c)}" for c in (
                stopping.MedianPrecision, stopping.RelativeNoise, stopping.FixedCount,
                stopping.TimeBudget)),
            "interval": "\n\n".join(f"{f.__name__}: {doc(f)}" for f in (
                stats.summarize, stats.median_interval, stats.rerun_interval,
                stats.floor_interval)),
            "pinning": doc(pinning),
            "guards": doc(guards),
            "history": doc(history),
            "speed_of_light": doc(speed_of_light) + "\n\n" + speed_of_light.peaks_text(),
            "comparison": "\n\n".join(f"{f.__name__}: {doc(f)}" for f in (
                engine.measure_interleaved, stats.paired_ratio, stats.compare_paired,
                stats.verdict))}


def tolerance_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"case": spec["name"], "dtype": dtype, "output": output or "every output",
             "atol": f"{t['atol']:g}", "rtol": f"{t['rtol']:g}",
             "draws per point": spec["verify"]["trials"], "why": t["reason"].strip()}
            for dtype, output, t in config.tolerance_rows(spec)]


def _measurements(ev: Evidence) -> list[dict[str, Any]]:
    return [r["measurement"] for r in (*ev.time.values(), *ev.baselines.values())
            if r["timed"]]


def execution_rows(evidence: list[Evidence]) -> list[dict[str, Any]]:
    """Every way code was executed in the records, per target and stage."""
    seen: dict[tuple, int] = {}
    for ev in evidence:
        found = [("verify", c["execution"]) for r in ev.verify.values() for c in r["checks"]
                 if "execution" in c]
        found += [("time", r["execution"]) for r in ev.time.values() if "execution" in r]
        found += [("baseline", r["execution"]) for r in ev.baselines.values()
                  if "execution" in r]  # a baseline not run here has none
        for stage, e in found:
            key = (ev.target, stage, e["mode"], e["interpret"], e["poisoned"],
                   e["race_detection"])
            seen[key] = seen.get(key, 0) + 1
    return [{"target": t, "stage": s, "mode": m, "interpret": "yes" if i else "no",
             "uninitialised memory poisoned": "yes" if p else "no",
             "race detection": "yes" if r else "no", "runs": n}
            for (t, s, m, i, p, r), n in sorted(seen.items())]


def stop_rows(evidence: list[Evidence]) -> list[dict[str, Any]]:
    """Why sampling stopped, as recorded, with how often."""
    counts: dict[tuple[str, str], int] = {}
    for ev in evidence:
        for m in _measurements(ev):
            counts[ev.target, m["stop_reason"]] = counts.get((ev.target, m["stop_reason"]),
                                                             0) + 1
    return [{"target": t, "stop reason": why, "measurements": n}
            for (t, why), n in sorted(counts.items())]


def _flat_facts(record: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    skip = {"schema_version", "kind", "commit", "created_at", "target"}
    facts = []
    for key, value in record.items():
        if prefix == "" and key in skip:
            continue
        if isinstance(value, dict):
            facts += _flat_facts(value, f"{prefix}{key}.")
        elif not isinstance(value, list):
            facts.append((f"{prefix}{key}", f"{value:.4g}" if isinstance(value, float)
                          else str(value)))
    return facts


def noise_floor(target: str, evidence: list[Evidence], href) -> dict[str, Any]:
    """The host's recorded A/A floor if there is one, and the noise the records show."""
    path = paths.noise_floor_record(target)
    recorded = None
    if Path(path).exists():
        record = records.read(path, "noise_floor")
        recorded = {"summary": conditions.floor_line(record), "facts": _flat_facts(record),
                    "href": href(path),
                    "created_at": record["created_at"], "commit": record["commit"]}
    noise = [m["relative_noise"] for ev in evidence for m in _measurements(ev)]
    observed = None
    if noise:
        observed = {"n": len(noise), "low": f"{min(noise):.1%}", "high": f"{max(noise):.1%}",
                    "median": f"{statistics.median(noise):.1%}"}
    return {"target": target, "path": path, "recorded": recorded, "observed": observed}


def _calibration_rows(data: dict[str, Any], design: str) -> list[dict[str, Any]]:
    verdicts = data["aa_verdicts"]
    false = verdicts["FASTER"] + verdicts["SLOWER"]
    targets = data["targets"]
    low, high = stats.share_interval(false, data["aa_trials"], 0.95)
    rows = [{"check": f"A/A trials, {design} design: false verdicts",
             "result": f"{false} of {data['aa_trials']} ({data['aa_false_share']:.1%}, 95% "
                       f"interval {low:.1%}–{high:.1%}); floor ±{data['noise_floor']:.2%}",
             "target": f"≤ {targets['aa_false_share_max']:.0%}"}]
    rows += [{"check": f"a true {effect} difference, {design} design: found",
              "result": f"{ab['verdicts']['FASTER']} of {ab['trials']}",
              "target": f"≥ {targets['detected_share_min']:.0%}"}
             for effect, ab in data["ab"].items()]
    return rows


def _coverage_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    shipped = data["coverage"]["config"]
    rows = [{"check": f"reruns of {workload} inside each other's intervals",
             "result": f"{w['pairs_inside']:.1%} of ordered pairs of {len(w['runs'])} "
                       f"fresh-process runs",
             "target": f"≥ {data['target']:.0%}"} for workload, w in shipped.items()]
    floors = data["floors"]["config"]
    rows.append({"check": f"the paired A/A floor, {len(floors)} reruns",
                 "result": ", ".join(f"±{f['paired_floor']:.1%}" for f in floors),
                 "target": "stable across reruns"})
    return rows


def _short(commit: str) -> str:
    """A commit as the page shows it: 12 digits, and whether the tree was dirty."""
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def protocol_checks() -> list[dict[str, Any]]:
    """What the measurement engine's own benchmarks found on the development host, from
    their committed records (``paths.PROTOCOL_CHECKS``; one not there is left out):
    A/A false verdicts and true effects found (calibration), and how often independent
    reruns land inside each other's intervals (rerun coverage)."""
    rows = []
    for path in paths.PROTOCOL_CHECKS:
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text())
            found = (_coverage_rows(data) if path.stem == "rerun_coverage" else
                     _calibration_rows(data, path.stem.removeprefix("calibration_")))
            made = (f"{data['created_at'][:10]}, {_short(data['commit'])}"
                    if "commit" in data else "made before records named their commit")
        except (ValueError, KeyError, TypeError) as error:
            raise CasebookError(path, str(error).strip("'"), "unreadable benchmark record "
                                "(rerun its benchmark)") from None
        # Not "record": that column of a page table links a record published with the site.
        record = f"{path.relative_to(paths.SOURCE_ROOT)} ({made})"
        rows += [{**row, "benchmark record": record} for row in found]
    return rows
