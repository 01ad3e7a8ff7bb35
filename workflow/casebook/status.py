"""A case's status line, derived from its records (never written by hand)."""

from __future__ import annotations

from casebook import conditions
from casebook.evidence import Evidence
from casebook.measure import stats


def line(ev: Evidence) -> str:
    parts = []
    modes = {c["execution"]["interpret"] for r in ev.verify.values() for c in r["checks"]
             if "execution" in c}
    if not ev.verify:
        parts.append("not verified")
    elif not ev.verified:
        failed = sum(not r["passed"] for r in ev.verify.values())
        parts.append(f"verification FAILED at {failed} of {len(ev.verify)} points")
    else:
        parts.append("verified in interpret mode" if True in modes
                     else f"verified on {ev.target.upper()}")
    built = sorted({a["target"] for b in ev.builds.values() for p in b["points"]
                    for a in p.get("artifacts", []) if a["target"] != "host"})
    if built:
        parts.append("lowered for " + ", ".join(built))
    timed = [r for r in ev.time.values() if r["timed"]]
    if timed and not ev.interpreted and ev.host["gpus"]:
        parts.append(f"measured on {ev.host['gpus'][0]['name']}")
    else:
        parts.append("not measured on GPU")
    verdicts = conditions.comparisons(ev)
    # Only speedups whose whole interval clears the noise floor are ever printed.
    faster = [(c.speedup, name) for (_, name, _), c in verdicts.items()
              if c.printable and c.verdict == stats.FASTER]
    if faster:
        best = max(faster)
        parts.append(f"up to {best[0]:.2f}× faster than {best[1]} (outside the "
                     f"±{ev.noise_floor['noise_floor']:.1%} noise floor)")
    if ev.stale:
        parts.append("STALE records")
    return " · ".join(parts)
