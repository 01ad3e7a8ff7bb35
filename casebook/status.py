"""A case's status on one target, derived from its records (never written by hand).

The status is a list of phrases, each with a tone — ``ok``, ``bad``, ``warn`` or
``note`` — so a page can show a failure as a failure.
"""

from __future__ import annotations

from casebook import conditions
from casebook.evidence import Evidence
from casebook.measure import stats


def hardware(ev: Evidence) -> str:
    """The hardware the records were made on, as one would name it."""
    gpus = [g["name"] for g in ev.host["gpus"]]
    if gpus:
        count = {name: gpus.count(name) for name in gpus}
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
    interpreted = any(c["execution"]["interpret"] for r in ev.ran.values()
                      for c in r["checks"] if "execution" in c)
    # Where some variants did not run, name the ones that were verified; always say what
    # ran (a numerics model, an interpreted kernel, a GPU kernel).
    which = f"{', '.join(sorted({v for v, _ in ev.ran}))} " if not_run else ""
    what = ", ".join(ev.subjects(list(ev.ran.values())))
    where = "in interpret mode on the host CPU" if interpreted else f"on {hardware(ev)}"
    weak = ev.weak
    return [_phrase(f"{which}verified ({what}) {where}", "ok"), *not_run,
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
    if not any(r["timed"] for r in ev.time.values()):
        return [_phrase("not timed" if ev.host["gpus"] else "not measured on GPU", "warn")]
    if ev.interpreted or not ev.host["gpus"]:
        where = "in interpret mode on the host CPU" if ev.interpreted else "on the host CPU"
        return [_phrase(f"timed {where} only", "warn"),
                _phrase("not measured on GPU", "warn")]
    return [_phrase(f"measured on {hardware(ev)}", "ok"), *_versus(ev)]


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
