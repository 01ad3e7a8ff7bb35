"""The rule files as Snakemake's own linter reads them: nothing to fix but its advice to
give each rule a conda environment or container, which the hash-pinned lock answers
(docs/environments.md)."""

from __future__ import annotations

import re
import subprocess
import sys

from casebook.core import paths

ANSWERED = {"Specify a conda environment or container for each rule."}


def test_snakemake_lint_finds_nothing_but_the_deployment_advice():
    done = subprocess.run([sys.executable, "-m", "snakemake", "--lint"],
                          cwd=paths.SOURCE_ROOT, capture_output=True, text=True, timeout=300)
    titles = re.findall(r"^    \* (.+?):?$", done.stdout + done.stderr, re.MULTILINE)
    assert titles, "the linter printed no lint at all: the parse below is broken"
    assert set(titles) <= ANSWERED, sorted(set(titles) - ANSWERED)
