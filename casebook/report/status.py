"""A case's status on one target, derived from its records (never written by hand).

The status is a list of phrases, each with a tone — ``ok``, ``bad``, ``warn`` or
``note`` — so a page can show a failure as a failure.
"""

from __future__ import annotations

from casebook.measure import stats
from casebook.measure.clocks import times_on_host
from casebook.report import conditions
from casebook.report.evidence import Evidence


def hardware(ev: Evidence) -> str:
    """The hardware the records were made on, as one would name it."""
    chips = [g["name"] for g in [*ev.host["gpus"], *ev.host.get("tpus", [])]]
    if chips:
        count = {name: chips.count(name) for name in chips}
        return ", ".join(f"{n}× {name}" if n > 1 else name for name, n in count.items())
    cpu = ev.host["cpu"]
    return f"{cpu['model']} CPU ({cpu['usable_cores']} cores), no GPU"


def _phrase(text: str, tone: str) -> dict[str, str]:
    return {"text": text, "tone": tone}


def _verification(ev: Evidence) -> list[dict[str, str]]:
    # One phrase per reason, naming every variant it holds back (said once, not per variant).
    held: dict[str, list[str]] = {}
    for variant, why in ev.not_run.items():
        held.setdefault(why, []).append(variant)
    not_run = [_phrase(f"{', '.join(variants)} not run here: {why}", "warn")
               for why, variants in held.items()]
    if not ev.ran:
        return not_run or [_phrase("not verified", "warn")]
    if not ev.verified:
        failed = sum(not r["passed"] for r in ev.ran.values())
        return [_phrase(f"verification FAILED at {failed} of {len(ev.ran)} points", "bad"),
                *not_run]
    # Where some variants did not run, name the ones that were verified; always say what
    # ran (a numerics model, an interpreted kernel, a GPU kernel) and where: on a GPU host
    # upstream's TPU kernel still runs in the interpreter beside the GPU kernels.
    which = f"{', '.join(sorted({v for v, _ in ev.ran}))} " if not_run else ""
    where: dict[str, list[str]] = {}
    for record in ev.ran.values():
        for check in record["checks"]:
            if "execution" in check:
                place = ("in interpret mode on the host CPU" if check["execution"]["interpret"]
                         else f"on {hardware(ev)}")
                kinds = where.setdefault(place, [])
                kinds += [k for k in ev.subjects([check]) if k not in kinds]
    device_first = sorted(where.items(), key=lambda found: found[0].startswith("in "))
    what = " and ".join(f"({', '.join(sorted(kinds))}) {place}"
                        for place, kinds in device_first)
    weak = ev.weak
    return [_phrase(f"{which}verified {what}", "ok"), *not_run,
            *([_phrase(f"check WEAK at {len(weak)} of {len(ev.ran)} verified points: "
                       + "; ".join(sorted(set(weak.values()))), "bad")] if weak else [])]


def _versus(ev: Evidence) -> list[dict[str, str]]:
    """Per baseline, at how many points the kernel was FASTER, and the largest speedup
    whose whole interval clears the host's noise floor (none is printed otherwise), with
    the baseline's own fraction of the speed of light there where it has one (a speedup
    over a baseline far from its bound says as much about the baseline)."""
    by_baseline: dict[str, list[tuple[str, stats.Comparison, bool]]] = {}
    for (variant, name, point), c in conditions.comparisons(ev).items():
        by_baseline.setdefault(name, []).append(
            (point, c, ev.comparison_stale(variant, point)))
    found = []
    for name, compared in by_baseline.items():
        faster = [(p, c, stale) for p, c, stale in compared if c.verdict == stats.FASTER]
        clear = [(c.speedup, p, stale) for p, c, stale in faster if c.printable]
        current = [item for item in clear if not item[2]]
        best = ""
        if clear:  # a current record's where any is, as the index's speedup
            speedup, point, stale = max(current or clear)
            sol = baseline_sol(ev, name, point)
            own = "" if sol is None else f" (there {name} runs at {sol:.1%} of SOL)"
            best = f", up to {speedup:.2f}×{own}" + (" in a stale comparison" if stale else "")
        found.append(_phrase(f"faster than {name} at {len(faster)} of {len(compared)} "
                             f"points{best}", "ok" if len(faster) == len(compared) else "note"))
    return found


def _measurement(ev: Evidence) -> list[dict[str, str]]:
    timed = {variant: r for (variant, _), r in ev.time.items() if r["timed"]}
    accelerated = ev.host["gpus"] or ev.host.get("tpus")
    if not timed:
        return [_phrase("not timed" if accelerated else "not measured on GPU", "warn"),
                *_baselines_on_device(ev)]
    on_host = sorted(v for v, r in timed.items() if times_on_host(r["execution"]))
    if len(on_host) == len(timed) or not accelerated:
        where = "in interpret mode on the host CPU" if ev.interpreted else "on the host CPU"
        return [_phrase(f"timed {where} only", "warn"),
                _phrase("not measured on GPU", "warn"), *_baselines_on_device(ev)]
    # A GPU host measured its kernels on the device; a host stand-in beside them (upstream's
    # interpreted TPU kernel) is named, its host time no speed result.
    beside = ([_phrase(f"{', '.join(on_host)} timed on the host only (no GPU time)", "note")]
              if on_host else [])
    return [_phrase(f"measured on {hardware(ev)}", "ok"), *beside, *_versus(ev)]


def _baselines_on_device(ev: Evidence) -> list[dict[str, str]]:
    """Where no variant was timed on an accelerator host's device (none runs there), the
    baselines that were, named: the device's figures a case page holds all the same."""
    names = sorted({name for (name, _), r in ev.baselines.items()
                    if r.get("timed") and not times_on_host(r["execution"])})
    if not names or not (ev.host["gpus"] or ev.host.get("tpus")):
        return []
    return [_phrase(f"baselines measured on {hardware(ev)}: {', '.join(names)}", "note")]


def parts(ev: Evidence) -> list[dict[str, str]]:
    """Verified where, lowered for what, measured where and against what."""
    found = _verification(ev)
    built = sorted({a["target"] for b in ev.builds.values() for p in b["points"]
                    for a in p.get("artifacts", []) if a["target"] != "host"})
    if built:
        found.append(_phrase("lowered for " + ", ".join(built), "note"))
    found += _measurement(ev)
    if ev.stale:
        found.append(_phrase("STALE records", "bad"))
    return found


def sol_fraction(record: dict) -> float | None:
    """A time record's fraction of the speed of light, where it has one and was timed on
    a device (an interpreter's or the host's time has none)."""
    if not record["timed"] or times_on_host(record["execution"]):
        return None
    return (record.get("speed_of_light") or {}).get("fraction")


def baseline_sol(ev: Evidence, name: str, point: str) -> float | None:
    """Baseline ``name``'s own fraction of the speed of light at ``point``, where it has one."""
    record = ev.baselines.get((name, point))
    return None if record is None else sol_fraction(record)


def _sol_best(ev: Evidence) -> tuple[float, bool] | None:
    """The largest fraction of the speed of light a timed device record reached, and
    whether it is stale: among the records current at these sources where any is (a
    stale one's figure would read as today's), else among all."""
    found = [(f, ev.stale_at(variant, point)) for (variant, point), record in ev.time.items()
             if (f := sol_fraction(record)) is not None]
    current = [item for item in found if not item[1]]
    return max(current or found, default=None)


def _speedup_best(ev: Evidence) -> tuple[tuple[str, str, str], stats.Comparison, bool] | None:
    """The largest printable FASTER speedup of a compare record, its (variant, baseline,
    point) and whether it is stale: among the current ones where any is, as ``_sol_best``."""
    found = [(key, c, ev.comparison_stale(key[0], key[2]))
             for key, c in conditions.comparisons(ev).items()
             if c.verdict == stats.FASTER and c.printable]
    current = [item for item in found if not item[2]]
    return max(current or found, key=lambda item: item[1].speedup, default=None)


def badges(ev: Evidence) -> list[dict[str, str]]:
    """The target's status as a few short badges for the index matrix (the sentences are
    on the case page): verified n/m, FAILED, not run here, WEAK, where it was timed, the
    headline speedup and fraction of the speed of light, STALE. Each with a ``title``
    saying more."""
    if not (ev.verify or ev.time or ev.baselines):
        return [{"text": "no record of this case", "tone": "warn",
                 "title": "this target's env and host records exist, no job of this case ran"}]
    found = []
    if ev.ran:
        failed = sum(not r["passed"] for r in ev.ran.values())
        found.append({"text": f"verified {len(ev.ran) - failed}/{len(ev.ran)}",
                      "tone": "ok" if not failed else "bad",
                      "title": "variant × point checks against the oracle that ran here"})
        if failed:
            found.append({"text": f"FAILED {failed}", "tone": "bad",
                          "title": "checks that failed verification"})
    if ev.not_run:
        found.append({"text": f"{len(ev.not_run)} not run here", "tone": "warn",
                      "title": "; ".join(sorted(set(ev.not_run.values())))})
    if ev.weak:
        found.append({"text": f"WEAK {len(ev.weak)}/{len(ev.ran)}", "tone": "bad",
                      "title": "; ".join(sorted(set(ev.weak.values())))})
    short = {"timed in interpret mode on the host CPU only": "interpreter times only",
             "timed on the host CPU only": "host times only",
             "not measured on GPU": "no GPU time", f"measured on {hardware(ev)}": "device time"}
    short.update({p["text"]: "baselines: device time" for p in _baselines_on_device(ev)})
    for phrase in _measurement(ev):
        if not phrase["text"].startswith("faster than "):
            found.append({"text": short.get(phrase["text"], phrase["text"]),
                          "tone": phrase["tone"], "title": phrase["text"]})
    faster = _speedup_best(ev)
    if faster is not None:
        (variant, name, point), best, stale = faster
        own = baseline_sol(ev, name, point)
        found.append({"text": f"{best.speedup:.1f}× faster", "tone": "ok",
                      "title": f"{variant} against {name} at {point} (paired, FASTER)"
                      + ("" if own is None else f"; {name} there at {own:.1%} of SOL")
                      + (", in a stale record (no current comparison is FASTER)" if stale
                         else "")})
    best = _sol_best(ev)
    if best is not None:
        sol, stale = best
        found.append({"text": f"{sol:.0%} of SOL", "tone": "note",
                      "title": "the largest fraction of the speed of light a device-timed "
                               "record reached" + (", in a stale record (no current one "
                                                   "has a fraction)" if stale else
                                                   ", among the current records")})
    if ev.stale:
        found.append({"text": "STALE", "tone": "bad",
                      "title": "records made from other kernel sources, case config or "
                               "tile-table rows than these"})
    return found
