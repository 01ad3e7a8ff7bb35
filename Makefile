# casebook: `make` regenerates everything, `make test` runs the tests. Both build .venv
# from the hash-pinned lock first when it is missing or the lock has changed.
#
#   make                  environment + `snakemake --cores all` (the whole site; resumes a
#                         killed run by itself)
#   make test             environment + lint + the test suite (installs Debian's chromium
#                         for the browser tests where it is missing: needs root, as CI is)
#   make test-fast        environment + lint + the tests that need no interpreter,
#                         compiler, workflow run, cluster, browser or GPU (pytest markers)
#   make env [LOCK=cuda]  just the environment (LOCK defaults to cuda where nvidia-smi
#                         sees a GPU, else cpu)
#   make bench            CPU calibration (comparisons measured interleaved, as the
#                         compare stage makes them), efficiency and rerun-coverage
#                         benchmarks of the measurement engine, and the 40-example fuzz of the splash attention port in
#                         the Mosaic GPU interpreter, and the draws of case 01's
#                         kernels (exact GEMMs, every variant), and the timer guards beside a
#                         CPU burner (a few minutes); results in
#                         benchmarks/results/
#   make gpu-host         what an offline GPU host lacks, in build/gpu-host/: the wheelhouse
#                         (parts of at most 60 MiB) and case 03's builds (docs/gpu-host.md)
#   make rehearse         the offline GPU host rehearsed on this CPU: Python 3.12 with the
#                         host's packages (env/rehearsal.lock), a copy of the tree with the
#                         bundle, benchmarks/gpu_host.sh --dry-run (installs it with
#                         --no-index, prints the window's plan), then a time-bounded subset
#                         of the kernel tests and `snakemake -n` for h200
#   make tpu-host         what the offline TPU host lacks, in build/tpu-host/ (docs/tpu.md)
#   make rehearse-tpu     the TPU host rehearsed on this CPU: Python 3.11 with the host's
#                         packages alone, the bundle installed by benchmarks/tpu_host.sh,
#                         the window's plan, `snakemake -n` for tpu-v5e, two real jobs,
#                         a comparison each of cases 03 and 01 for tpu-v5e run on the CPU
#                         (forced: the committed chip records would make them no-ops)
#   make lock             regenerate env/cpu.lock, env/cuda.lock, env/reference.lock and
#                         env/rehearsal.lock
#   make clean            remove generated records, figures and the site

LOCK ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
PYTHON_cpu := python3.11
PYTHON_cuda := python3.12
PYTHON ?= $(PYTHON_$(LOCK))
VENV := .venv
STAMP := $(VENV)/.lock-$(LOCK).sha256
BIN := $(VENV)/bin
CHROMIUM := /usr/bin/chromium

# The GPU host: its Python, the bundle it is given, and its rehearsal here.
HOST_PYTHON := PYENV_VERSION=3.12.1 python3.12
BUNDLE := build/gpu-host
REHEARSAL := build/rehearsal
HOST_BIN := $(CURDIR)/$(REHEARSAL)/host/bin
# The host has cuobjdump and nvdisasm on PATH; here they come from the CPU lock's wheels.
CUDA_BIN = $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/nvidia/cu13/bin))
TREE := $(CURDIR)/$(REHEARSAL)/tree
IN_HOST = cd $(TREE) && CASEBOOK_HOST_REHEARSAL=1 PATH=$(CURDIR)/$(CUDA_BIN):$$PATH \
	PYTHONPATH=$(TREE)/$(BUNDLE)/site:$(TREE)
# The tests marked host_rehearsal (pytest -m; each case's interpret-mode and lowering tests
# among them) under jax 0.11.2, a worker per core: 7.5 min on one core (jax 0.11.2's Mosaic
# GPU layout inference takes 50 s for each of the fused MoE kernel's two lowerings);
# `timeout` stops a hang.
REHEARSED := host_rehearsal

.PHONY: all run env test test-fast lint bench lock clean chromium gpu-host tpu-host rehearse \
	rehearse-tpu
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

# The project itself (casebook, the case packages, the progress-line plug-in that Snakemake
# finds when it starts), installed editable: it reads configs and templates from here.
INSTALLED := $(VENV)/.installed
$(INSTALLED): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
		--no-build-isolation --no-index --editable .
	touch $@

env: $(STAMP) $(INSTALLED)

# A killed run resumes by itself: make holds its own lock on the folder (flock, released
# when the process holding it dies), so a Snakemake lock found then is a killed run's and
# is cleared, and the jobs it left incomplete are rerun.
RUN_LOCK := .snakemake/make-run.lock
run: env
	@mkdir -p .snakemake
	@flock --nonblock --conflict-exit-code 75 $(RUN_LOCK) sh -c \
		'$(BIN)/snakemake --unlock --quiet && $(BIN)/snakemake --cores all --rerun-incomplete'; \
		status=$$?; [ $$status -ne 75 ] || echo "make: another make run holds $(RUN_LOCK)" >&2; \
		exit $$status
	$(BIN)/python -m casebook.report.verdict

# One pytest worker per core (pytest-xdist), a test file per worker: a file's module fixtures
# (a workflow run, a SLURM cluster, an nvcc build) are made once; the longest files start
# first (tests/conftest.py), in that order.
test: env lint chromium
	CASEBOOK_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest --numprocesses auto --dist loadfile --no-loadscope-reorder

# The browser the site's tests drive (Playwright with executable_path; never `playwright
# install`, which downloads a browser build).
# The tier without the interpreter, compilers, workflow runs, SLURM, browser or GPU: the
# library, the measurement engine, configs, records, pages, numerics (under 3 minutes).
FAST := not (e2e or slurm or browser or interpret or compile or gpu)
test-fast: env lint
	$(BIN)/python -m pytest --numprocesses auto -m "$(FAST)"

chromium:
	@test -x $(CHROMIUM) || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

lint: env
	$(BIN)/ruff check .

bench: env
	$(BIN)/python -m benchmarks.calibration
	$(BIN)/python -m benchmarks.efficiency
	$(BIN)/python -m benchmarks.rerun_coverage
	$(BIN)/python -m benchmarks.fuzz_mgpu --examples 40
	$(BIN)/python -m benchmarks.fuzz_moe_nvfp4 --draws 3
	$(BIN)/python -m benchmarks.reuse_guard_load
	$(BIN)/python -m benchmarks.exploit_corpus

gpu-host: env
	rm -rf $(BUNDLE)
	$(BIN)/python -m casebook.hosts.wheelhouse build $(BUNDLE)
	$(BIN)/python -m kernels.grouped_gemm_fp8_bf16.prebuild \
		build/grouped_gemm_fp8_bf16 $(BUNDLE)/case03-build.tar.xz
	@ls -l $(BUNDLE)

# The TPU host's bundle (benchmarks/tpu_host.sh installs it there): the cp311 wheels of
# env/cpu.lock it lacks, and the tree's commit (tree.json). Carried with the tree: 64 MiB
# in all.
TPU_BUNDLE := build/tpu-host
tpu-host: env
	rm -rf $(TPU_BUNDLE)
	$(BIN)/python -m casebook.hosts.wheelhouse build $(TPU_BUNDLE) --host tpu
	@du -sh $(TPU_BUNDLE)

rehearse: gpu-host
	rm -rf $(REHEARSAL) && mkdir -p $(REHEARSAL)/tree/build
	$(HOST_PYTHON) -m venv $(REHEARSAL)/host
	$(HOST_BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
		--require-hashes -r env/rehearsal.lock
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(REHEARSAL)/tree
	cp -r $(BUNDLE) $(REHEARSAL)/tree/build/
	cd $(REHEARSAL)/tree && CASEBOOK_PYTHON=$(HOST_BIN)/python bash benchmarks/gpu_host.sh \
		$(CURDIR)/$(REHEARSAL)/out --dry-run --target h200
	$(IN_HOST) timeout 900 $(HOST_BIN)/python -m pytest -q -p no:cacheprovider \
		--numprocesses auto --dist loadfile -m "$(REHEARSED)" tests
	$(IN_HOST) $(HOST_BIN)/python -m snakemake -n --quiet rules --cores all \
		--config target=h200

# The TPU host rehearsed on this CPU: a Python 3.11 with only the host's own packages (the
# lock's pins of them), a copy of the tree with the bundle, benchmarks/tpu_host.sh --dry-run
# (installs the bundle with --no-index, appended to PYTHONPATH; prints the window's plan),
# `snakemake -n` for tpu-v5e, the env and host jobs run for real there (target cpu), and
# one comparison each of cases 03 and 01 run there for tpu-v5e on this CPU (the next
# window's first jobs: their lowerings, verifications, times and baselines in the host's
# packages; XLA runs on the CPU here).
TPU_REHEARSAL := build/tpu-rehearsal
TPU_TREE := $(CURDIR)/$(TPU_REHEARSAL)/tree
rehearse-tpu: tpu-host
	rm -rf $(TPU_REHEARSAL) && mkdir -p $(TPU_REHEARSAL)/tree/build
	$(PYTHON_cpu) -m venv $(TPU_REHEARSAL)/host
	$(BIN)/python -m casebook.hosts.wheelhouse kept --host tpu > $(TPU_REHEARSAL)/host.txt
	$(TPU_REHEARSAL)/host/bin/python -m pip install --quiet --disable-pip-version-check \
		--no-deps --require-hashes -r $(TPU_REHEARSAL)/host.txt
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(TPU_TREE)
	cp -r $(TPU_BUNDLE) $(TPU_TREE)/build/
	cd $(TPU_TREE) && CASEBOOK_PYTHON=$(CURDIR)/$(TPU_REHEARSAL)/host/bin/python \
		bash benchmarks/tpu_host.sh $(CURDIR)/$(TPU_REHEARSAL)/out --dry-run --target tpu-v5e
	cd $(TPU_TREE) && PYTHONPATH=$(TPU_TREE):$(TPU_TREE)/$(TPU_BUNDLE)/site \
		$(CURDIR)/$(TPU_REHEARSAL)/host/bin/python -m snakemake -n --quiet rules --cores all \
		--config target=tpu-v5e && \
		PYTHONPATH=$(TPU_TREE):$(TPU_TREE)/$(TPU_BUNDLE)/site \
		$(CURDIR)/$(TPU_REHEARSAL)/host/bin/python -m snakemake --cores all --quiet \
		--config target=cpu -- results/cpu/env.json results/cpu/host.json
	cd $(TPU_TREE) && PYTHONPATH=$(TPU_TREE):$(TPU_TREE)/$(TPU_BUNDLE)/site \
		$(CURDIR)/$(TPU_REHEARSAL)/host/bin/python -m snakemake --cores all --quiet \
		--config target=tpu-v5e --allowed-rules lower verify time baseline compare \
		--forcerun lower verify time baseline compare -- \
		results/tpu-v5e/grouped_gemm_fp8_bf16/compare/test_small.json \
		results/tpu-v5e/moe_nvfp4/compare/e2_m128_h256_i256.json

lock: env
	$(BIN)/uv pip compile env/cpu.in --generate-hashes --no-header --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 -o env/cpu.lock
	$(BIN)/uv pip compile env/cuda.in --generate-hashes --no-header --python-version 3.12 \
		--python-platform x86_64-manylinux_2_28 -o env/cuda.lock
	$(BIN)/uv pip compile env/reference.in --no-deps --generate-hashes --no-header \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 -o env/reference.lock
	$(BIN)/uv pip compile env/rehearsal.in --generate-hashes --no-header --python-version 3.12 \
		--python-platform x86_64-manylinux_2_28 -o env/rehearsal.lock

clean:
	rm -rf results/cpu results/figures site/public site/public.new site/public.old build/site \
		logs .snakemake test-artifacts
