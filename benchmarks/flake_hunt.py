"""A flake hunt: one tier of the tests run again and again, fresh seeds each time, with or
without a CPU burner beside it, and every test whose outcome varied.

Each run is a separate ``pytest`` process (the tests draw fresh seeds per run: the
``rng`` fixture prints the seed a failure replays with), its outcomes read from a JUnit
XML report. With ``--burner N``, N processes spin beside the runs for their whole
length, as a busy CI machine would. The record, ``benchmarks/results/flake_hunt_<name>.json``,
holds every run's counts and wall time, each test's outcomes, and the first line of every
failure; docs/testing.md lists the tests it found and how each was fixed.

    .venv/bin/python -m benchmarks.flake_hunt fast --runs 20 [--burner 2] -- -m "not e2e"
    .venv/bin/python -m benchmarks.flake_hunt rehearsal --runs 3 --python PY --cwd TREE \\
        --env PYTHONPATH=... -- tests/...

Arguments after ``--`` go to pytest (a marker expression, files, ``--numprocesses``).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import workloads


def spin(parent: int) -> None:
    """Burn a core until the hunt ends, or dies (then this is orphaned)."""
    while os.getppid() == parent:
        for _ in range(100_000):
            pass


@contextlib.contextmanager
def burning(processes: int) -> Iterator[None]:
    """``processes`` burners spinning for the length of the block."""
    # spawned, not forked: the hunt's process may hold jax's threads
    spawn = multiprocessing.get_context("spawn")
    burners = [spawn.Process(target=spin, args=(os.getpid(),), daemon=True)
               for _ in range(processes)]
    for b in burners:
        b.start()
    try:
        yield
    finally:
        for b in burners:
            b.terminate()
            b.join()


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, first line of its message) from a JUnit XML ``report``."""
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error"}.get(child.tag, "skipped")
                message = (child.get("message") or child.text or "").strip().splitlines()
                message = message[0][:300] if message else ""
                break
        found[name] = (outcome, message)
    return found


def run_once(python: str, cwd: Path, env: dict[str, str], pytest_args: list[str],
             log: Path) -> tuple[dict[str, tuple[str, str]], float, int, float]:
    """One pytest process, its output written to ``log``: its outcomes by test id, wall
    seconds, exit status, and the peak resident memory of its largest process (GiB; a
    worker the kernel killed for memory shows here first)."""
    with tempfile.TemporaryDirectory() as tmp, log.open("w") as output:
        report = Path(tmp) / "report.xml"
        start = time.perf_counter()
        process = subprocess.Popen(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=20",
             f"--junitxml={report}", *pytest_args],
            cwd=cwd, env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        found = outcomes(report) if report.exists() else {}
    return found, wall, os.waitstatus_to_exitcode(status), usage.ru_maxrss / 2**20


def tree_state(cwd: Path) -> str:
    """The commit checked out in ``cwd``, ``-dirty`` when its tracked files differ."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
    return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain",
                                                       "--untracked-files=no") else "")


def hunt(runs: int, burner: int, python: str, cwd: Path, env: dict[str, str],
         pytest_args: list[str], logs: Path) -> dict[str, Any]:
    """``runs`` runs of the tests, with ``burner`` spinning processes beside them; each
    run's output in ``logs``."""
    logs.mkdir(parents=True, exist_ok=True)
    tested = tree_state(cwd)
    history: dict[str, list[str]] = defaultdict(list)
    messages: dict[str, list[str]] = defaultdict(list)
    per_run = []
    with burning(burner):
        for number in range(runs):
            found, wall, status, peak_gib = run_once(python, cwd, env, pytest_args,
                                                     logs / f"run{number + 1}.log")
            counts = Counter(outcome for outcome, _ in found.values())
            per_run.append({"run": number, "wall_s": round(wall, 1), "exit_status": status,
                            "peak_rss_gib": round(peak_gib, 2),
                            **{k: counts.get(k, 0) for k in
                               ("passed", "failed", "error", "skipped")}})
            failing = []
            for test, (outcome, message) in found.items():
                history[test].append(outcome)
                if outcome in ("failed", "error"):
                    messages[test].append(message)
                    failing.append(f"  {outcome}: {test}: {message}")
            print(f"run {number + 1}/{runs}: {dict(counts)}, {wall:.0f} s, exit {status}, "
                  f"peak {peak_gib:.1f} GiB",
                  *failing, sep="\n", file=sys.stderr, flush=True)
    varied = {test: dict(Counter(seen)) for test, seen in history.items()
              if len(set(seen)) > 1 or len(seen) < runs}
    always_failed = sorted(test for test, seen in history.items()
                           if len(seen) == runs and set(seen) <= {"failed", "error"})
    if tree_state(cwd) != tested:
        raise SystemExit(f"{cwd}: the tree changed during the hunt (was {tested}); "
                         "its outcomes belong to no one commit, and no record is written")
    return {"tested_commit": tested, "runs": runs, "burner_processes": burner,
            "pytest_args": pytest_args, "python": python, "tests": len(history), "per_run": per_run,
            "varied": varied, "always_failed": always_failed,
            "failure_messages": dict(messages)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the record's name: flake_hunt_<name>.json")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burner", type=int, default=0, help="spinning processes beside")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--cwd", type=Path, default=Path.cwd())
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--logs", type=Path, default=Path("build/flake_hunt"),
                        help="each run's pytest output goes to LOGS/<name>/run<N>.log")
    args = parser.parse_args(ours)
    if args.runs < 1 or args.burner < 0:
        parser.error("--runs must be at least 1 and --burner at least 0")
    env = dict(item.split("=", 1) for item in args.env)
    result = hunt(args.runs, args.burner, args.python, args.cwd, env, pytest_args,
                  args.logs.resolve() / args.name)
    path = workloads.write(f"flake_hunt_{args.name}", result)
    print(f"{len(result['varied'])} test(s) varied, {len(result['always_failed'])} always "
          f"failed: {path}")
    return 1 if result["varied"] or result["always_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
