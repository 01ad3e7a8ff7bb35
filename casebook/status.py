"""A case's status on one target, derived from its records (never written by hand).

The status is a list of phrases, each with a tone — ``ok``, ``bad``, ``warn`` or
``note`` — so a page can show a failure as a failure.
"""

from __future__ import annotations

from casebook import conditions
from casebook.evidence import Evidence
from casebook.measure import stats
from casebook.measure.clocks import times_on_host


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
    not_run = [_phrase(f"{variant} not run here: {why}", "warn")
               for variant, why in ev.not_run.items()]
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
    whose whole interval clears the host's noise floor (none is printed otherwise)."""
    by_baseline: dict[str, list[stats.Comparison]] = {}
    for (_, name, _), c in conditions.comparisons(ev).items():
        by_baseline.setdefault(name, []).append(c)
    found = []
    for name, compared in by_baseline.items():
        faster = [c for c in compared if c.verdict == stats.FASTER]
        clear = sorted(c.speedup for c in faster if c.printable)
        best = f", up to {clear[-1]:.2f}×" if clear else ""
        found.append(_phrase(f"faster than {name} at {len(faster)} of {len(compared)} "
                             f"points{best}", "ok" if len(faster) == len(compared) else "note"))
    return found


def _measurement(ev: Evidence) -> list[dict[str, str]]:
    timed = {variant: r for (variant, _), r in ev.time.items() if r["timed"]}
    accelerated = ev.host["gpus"] or ev.host.get("tpus")
    if not timed:
        return [_phrase("not timed" if accelerated else "not measured on GPU", "warn")]
    on_host = sorted(v for v, r in timed.items() if times_on_host(r["execution"]))
    if len(on_host) == len(timed) or not accelerated:
        where = "in interpret mode on the host CPU" if ev.interpreted else "on the host CPU"
        return [_phrase(f"timed {where} only", "warn"),
                _phrase("not measured on GPU", "warn")]
    # A GPU host measured its kernels on the device; a host stand-in beside them (upstream's
    # interpreted TPU kernel) is named, its host time no speed result.
    beside = ([_phrase(f"{', '.join(on_host)} timed on the host only (no GPU time)", "note")]
              if on_host else [])
    return [_phrase(f"measured on {hardware(ev)}", "ok"), *beside, *_versus(ev)]


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
