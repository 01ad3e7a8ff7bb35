# casebook: `make` regenerates everything, `make test` runs the tests. Both build .venv
# from the hash-pinned lock first when it is missing or the lock has changed.
#
#   make                  environment + `snakemake --cores all` (the whole site)
#   make test             environment + lint + the test suite (installs Debian's chromium
#                         for the browser tests where it is missing: needs root, as CI is)
#   make env [LOCK=cuda]  just the environment (LOCK defaults to cuda where nvidia-smi
#                         sees a GPU, else cpu)
#   make bench            CPU calibration and efficiency benchmarks of the measurement
#                         engine, and the 40-example fuzz of the splash attention port in
#                         the Mosaic GPU interpreter, and the draws of case 01's
#                         kernels (exact GEMMs, every variant) (a few minutes); results in
#                         benchmarks/results/
#   make lock             regenerate env/cpu.lock, env/cuda.lock and env/reference.lock
#   make clean            remove generated records, figures and the site

LOCK ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
PYTHON_cpu := python3.11
PYTHON_cuda := python3.12
PYTHON ?= $(PYTHON_$(LOCK))
VENV := .venv
STAMP := $(VENV)/.lock-$(LOCK).sha256
BIN := $(VENV)/bin
CHROMIUM := /usr/bin/chromium

.PHONY: all run env test lint bench lock clean chromium
all: run

$(STAMP): env/$(LOCK).lock env/reference.lock
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found; env/$(LOCK).lock needs it" >&2; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
		--require-hashes -r env/$(LOCK).lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
		--require-hashes -r env/reference.lock
	sha256sum env/$(LOCK).lock env/reference.lock > $@

env: $(STAMP)

run: env
	$(BIN)/snakemake --cores all

test: env lint chromium
	CASEBOOK_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest

# The browser the site's tests drive (Playwright with executable_path; never `playwright
# install`, which downloads a browser build).
chromium:
	@test -x $(CHROMIUM) || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

lint: env
	$(BIN)/ruff check .

bench: env
	PYTHONPATH=workflow:. $(BIN)/python -m benchmarks.calibration
	PYTHONPATH=workflow:. $(BIN)/python -m benchmarks.efficiency
	PYTHONPATH=workflow:. $(BIN)/python -m benchmarks.fuzz_mgpu --examples 40
	PYTHONPATH=workflow:. $(BIN)/python -m benchmarks.fuzz_moe_nvfp4 --draws 3

lock: env
	$(BIN)/uv pip compile env/cpu.in --generate-hashes --no-header --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 -o env/cpu.lock
	$(BIN)/uv pip compile env/cuda.in --generate-hashes --no-header --python-version 3.12 \
		--python-platform x86_64-manylinux_2_28 -o env/cuda.lock
	$(BIN)/uv pip compile env/reference.in --no-deps --generate-hashes --no-header \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 -o env/reference.lock

clean:
	rm -rf results/cpu results/figures site/public logs .snakemake test-artifacts
