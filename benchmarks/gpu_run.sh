#!/usr/bin/env bash
# The one prepared run on a GPU host, sized for a short window: the steps of
# configs/gpu-window.yaml in priority order, each stopped at its budget, then one archive
# of results/<target>/ and the logs (casebook.hosts.gpu_window). Bring the archive back and
# import it where the repository is: python -m casebook.hosts.archive import ARCHIVE.
#
#   bash benchmarks/gpu_run.sh --dry-run [--target h200]   # the plan and budgets only
#   bash benchmarks/gpu_run.sh --out DIR                   # run; the archive lands in DIR
#
# CASEBOOK_PYTHON: the interpreter (default .venv/bin/python where it exists, else python3).
# CASEBOOK_SITE: a folder made by `python -m casebook.hosts.host_install` on an offline
# host, put first on PYTHONPATH. CASEBOOK_COMMIT: the commit of a carried tree (it wins over
# a .git carried beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CASEBOOK_PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then CASEBOOK_PYTHON=.venv/bin/python; else CASEBOOK_PYTHON=python3; fi
fi
export PYTHONPATH="${CASEBOOK_SITE:+$CASEBOOK_SITE:}$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$CASEBOOK_PYTHON" -m casebook.hosts.gpu_window "$@"
