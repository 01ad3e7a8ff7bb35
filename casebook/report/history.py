"""Results across commits: every timed figure kept per commit it was measured at, two
revisions compared, and each figure's history with its steps.

- The store: one ``history`` record per figure (``time/<variant>/<point>``,
  ``baseline/<name>/<point>``) and commit, at ``paths.history_entry``: the figure's kept
  samples, median and interval, the noise floor it was measured under, the kernel
  sources' hash and what ran (``binary_sha256``: the lowered module or compiled file).
  Every time and baseline job keeps its record there as it writes it (``keep``); a rerun
  at one commit replaces that commit's entry. A GPU target's store is committed with its
  records; the CPU's stays on the machine that measured it, as its records do.
- ``compare(base, new)``: every figure both revisions measured, new against base, as two
  separate measurements: the ratio of medians with its bootstrap interval and the verdict
  against the noise floor (the wider of the two entries'). Where both ran the same binary
  the verdict expected is SAME: any other is a miscalibrated floor, reported as that and
  not as a change.
- ``steps(target, case)``: each figure's entries in commit order, each compared with the
  one before; a step is a FASTER or SLOWER verdict between two binaries.

    python -m casebook.report.history compare BASE NEW [--target T]   # exit 1: something SLOWER
    python -m casebook.report.history import REV...                    # records committed at REVs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from casebook.core import config, paths, records
from casebook.core.errors import CasebookError
from casebook.measure import samples_file, stats

# A revision the store keys by: a commit, or one with uncommitted changes (-dirty).
REVISION = re.compile(r"^[0-9a-f]{7,40}(-dirty)?$")
MISCALIBRATED = "MISCALIBRATED"  # the same binary judged other than SAME
KINDS = ("time", "baseline")
EXIT_SLOWER, EXIT_ERROR = 1, 2


def figure_of(record: dict[str, Any]) -> str:
    """``time/<variant>/<point>`` or ``baseline/<name>/<point>``."""
    subject = record["variant"] if record["kind"] == "time" else record["baseline"]
    return f"{record['kind']}/{subject}/{record['point']}"


def keep(record: dict[str, Any], samples: list[float] | None = None,
         root: Path = Path()) -> str | None:
    """Keep a timed time or baseline ``record`` in its target's store under ``root``,
    with its kept ``samples`` (None: read from its samples file); the entry's path, or
    None where there is nothing to keep (not timed) or no revision to key it by (not a
    git checkout)."""
    if record["kind"] not in KINDS or not record.get("timed"):
        return None
    if not REVISION.match(record["commit"]):
        return None
    measurement = record["measurement"]
    if samples is None:
        samples = samples_file.read_kept(root / measurement["samples_file"])
    figure = figure_of(record)
    path = root / paths.history_entry(record["target"], record["commit"], record["case"],
                                      figure)
    records.write(path, "history", {
        "target": record["target"], "case": record["case"], "figure": figure,
        "measured_commit": record["commit"], "measured_at": record["created_at"],
        "record": measurement["samples_file"].removesuffix(".samples.csv") + ".json",
        "sources_sha256": record.get("sources_sha256"),
        "binary_sha256": measurement.get("binary_sha256"),
        "execution": record["execution"]["mode"], "clock_kind": measurement["clock_kind"],
        "samples_s": samples, "median_s": measurement["median_s"],
        "ci_low_s": measurement["ci_low_s"], "ci_high_s": measurement["ci_high_s"],
        "noise_floor": measurement["floor_applied"]})
    return str(path)


def entries(target: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The store of ``target``: revision -> figure (``case/figure``) -> entry."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    root = Path(paths.history_dir(target))
    for path in sorted(root.glob("*/*/*/*/*.json")):
        entry = records.read(path, "history")
        revision = path.relative_to(root).parts[0]
        if entry["measured_commit"] != revision:
            raise CasebookError(path, "measured_commit", f"is {entry['measured_commit']!r}, "
                                f"but the entry is filed under revision {revision!r}")
        found.setdefault(revision, {})[f"{entry['case']}/{entry['figure']}"] = entry
    return found


def _git(*args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(paths.SOURCE_ROOT), *args], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def resolve(target: str, revision: str, store: dict[str, Any]) -> str:
    """The store's revision that ``revision`` names: itself, a git revision (``HEAD~1``,
    a tag, a short sha) resolved to its commit, or the one revision it is a prefix of."""
    if revision in store:
        return revision
    commit = _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if commit in store:
        return commit
    prefixed = [r for r in store if r.startswith(revision)]
    if len(prefixed) == 1:
        return prefixed[0]
    known = ", ".join(r[:12] for r in order(store)) or "none"
    why = "no such revision in the store" if not prefixed else \
        f"names {len(prefixed)} revisions"
    raise CasebookError(paths.history_dir(target), revision, f"{why} (kept: {known})")


def order(revisions: Any) -> list[str]:
    """``revisions`` oldest first: by commit time (a -dirty one just after its commit),
    then by name; one git does not know goes last."""
    def key(revision: str) -> tuple[float, int, str]:
        seconds = _git("log", "-1", "--format=%ct", revision.removesuffix("-dirty"))
        return (float(seconds) if seconds else float("inf"), revision.endswith("-dirty"),
                revision)
    return sorted(revisions, key=key)


@dataclasses.dataclass(frozen=True)
class Change:
    """One figure from a base revision to a new one."""

    figure: str
    base: dict[str, Any]
    new: dict[str, Any]
    comparison: stats.Comparison

    @property
    def same_binary(self) -> bool | None:
        """Whether both ran the same binary; None: one of them did not say."""
        a, b = self.base["binary_sha256"], self.new["binary_sha256"]
        return None if a is None or b is None else a == b

    @property
    def finding(self) -> str:
        """The verdict, or MISCALIBRATED where the same binary was judged not SAME."""
        verdict = self.comparison.verdict
        if self.same_binary and verdict != stats.SAME:
            return MISCALIBRATED
        return verdict

    def as_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "base_median_s": self.base["median_s"],
                "new_median_s": self.new["median_s"], "same_binary": self.same_binary,
                "finding": self.finding, **self.comparison.as_dict()}


def compare(base: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]],
            confidence: float) -> list[Change]:
    """Every figure both revisions measured, ``new`` against ``base``: speedup > 1 is
    new faster, judged against the wider of their noise floors (none recorded: no band,
    never SAME)."""
    changes = []
    for figure in sorted(base.keys() & new.keys()):
        a, b = base[figure], new[figure]
        floors = [e["noise_floor"] for e in (a, b)]
        floor = None if None in floors else max(floors)
        changes.append(Change(figure, a, b, stats.compare(b["samples_s"], a["samples_s"],
                                                          confidence, floor)))
    return changes


def steps(target: str, case: str) -> dict[str, list[dict[str, Any]]]:
    """Each figure of ``case`` on ``target``: its entries oldest first, each with its
    change from the one before (None for the first)."""
    store = entries(target)
    confidence = config.measurement_defaults()["confidence"]
    series: dict[str, list[dict[str, Any]]] = {}
    for revision in order(store):
        for figure, entry in sorted(store[revision].items()):
            if entry["case"] != case:
                continue
            history = series.setdefault(figure, [])
            change = (compare({figure: history[-1]["entry"]}, {figure: entry}, confidence)[0]
                      if history else None)
            history.append({"revision": revision, "entry": entry, "change": change})
    return series


def is_step(change: Change | None) -> bool:
    """A change in speed between two binaries (or binaries not named)."""
    return change is not None and change.finding in (stats.FASTER, stats.SLOWER)


def import_revision(revision: str) -> list[str]:
    """Keep every timed time and baseline record committed at git ``revision`` (its
    samples from the samples file committed beside it): a store begun after them."""
    commit = _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if commit is None:
        raise CasebookError(paths.SOURCE_ROOT, revision, "not a git revision here")
    listed = _git("ls-tree", "-r", "--name-only", commit, "--", paths.RESULTS) or ""
    kept = []
    for name in listed.splitlines():
        parts = name.split("/")
        if len(parts) != 6 or parts[3] not in KINDS or not name.endswith(".json"):
            continue
        record = json.loads(_git("show", f"{commit}:{name}") or "null")
        if not isinstance(record, dict) or not record.get("timed"):
            continue
        stored = record["measurement"]["samples_file"]
        samples = samples_file.kept(_git("show", f"{commit}:{stored}") or "")
        path = keep(record, samples)
        if path:
            kept.append(path)
    return kept


def _print(changes: list[Change], base: str, new: str) -> None:
    print(f"{new[:12]} against {base[:12]}: {len(changes)} figure(s) measured at both")
    for c in changes:
        x = c.comparison
        binary = {True: "same binary", False: "other binary", None: "binary not named"}
        print(f"  {c.figure}: {c.base['median_s'] * 1e6:.4g} µs -> "
              f"{c.new['median_s'] * 1e6:.4g} µs, speedup {x.speedup:.3f} "
              f"[{x.low:.3f}, {x.high:.3f}], floor "
              f"{'none' if x.floor is None else f'±{x.floor:.2%}'}: {c.finding} "
              f"({binary[c.same_binary]})")
        if c.finding == MISCALIBRATED:
            print(f"    the same binary judged {x.verdict}: the noise floor is "
                  f"miscalibrated, not a change")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m casebook.report.history", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    against = sub.add_parser("compare", help="every figure of NEW against BASE; exit 1 "
                                             "when one is SLOWER beyond the floor")
    against.add_argument("base")
    against.add_argument("new")
    against.add_argument("--target", default="cpu")
    against.add_argument("--json", action="store_true", help="the changes as JSON")
    backfill = sub.add_parser("import", help="keep the records committed at revisions")
    backfill.add_argument("revisions", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            for revision in args.revisions:
                print(f"{revision}: kept {len(import_revision(revision))} figure(s)")
            return 0
        store = entries(args.target)
        base = resolve(args.target, args.base, store)
        new = resolve(args.target, args.new, store)
        changes = compare(store[base], store[new],
                          config.measurement_defaults()["confidence"])
    except CasebookError as error:
        print(f"casebook: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if not changes:
        print(f"casebook: error: no figure was measured at both {base} and {new}",
              file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps([c.as_dict() for c in changes], indent=2))
    else:
        _print(changes, base, new)
    return EXIT_SLOWER if any(c.finding == stats.SLOWER for c in changes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
