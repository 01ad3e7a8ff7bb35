"""Pinning a measuring process to one CPU, before jax starts, and saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from casebook.core import paths
from casebook.measure import pinning
from casebook.run import worker

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                    reason="no Linux CPU affinity on this OS")


def test_the_highest_allowed_cpu_is_chosen():
    assert pinning.chosen_cpu({0, 3, 1}) == 3
    with pytest.raises(ValueError, match="no CPU"):
        pinning.chosen_cpu(set())


def _in_fresh_process(code: str, **env_vars: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(paths.SOURCE_ROOT), **env_vars}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_affinity
def test_a_cpu_job_is_pinned_before_jax_and_xla_starts_on_that_cpu():
    allowed = os.sched_getaffinity(0)
    got = _in_fresh_process(
        "import json, os\n"
        "from casebook.measure import pinning\n"
        "cpu = pinning.pin_for('cpu', {'pin_cpu': True})\n"
        "import jax.numpy as jnp\n"
        "jnp.ones(4).block_until_ready()\n"
        "tasks = os.listdir('/proc/self/task')\n"
        "threads = {t: sorted(os.sched_getaffinity(int(t))) for t in tasks}\n"
        "print(json.dumps({'cpu': cpu, 'pinned': pinning.pinned_cpu(), 'threads': threads}))")
    assert got["cpu"] == max(allowed) and got["pinned"] == got["cpu"]
    assert len(got["threads"]) > 1  # XLA's pool exists, and it too is on that one CPU
    assert all(cpus == [got["cpu"]] for cpus in got["threads"].values())


@needs_affinity
def test_gpu_targets_host_stand_ins_and_pin_cpu_false_are_never_pinned():
    got = _in_fresh_process(
        "import json\n"
        "from casebook.measure import pinning\n"
        "print(json.dumps([pinning.pin_for('h200', {'pin_cpu': True}),\n"
        "                  pinning.pin_for('cpu', {'pin_cpu': True}, stand_in=True),\n"
        "                  pinning.pin_for('cpu', {'pin_cpu': False}), pinning.pinned_cpu()]))")
    expected_unpinned = None if len(os.sched_getaffinity(0)) > 1 else min(os.sched_getaffinity(0))
    assert got == [None, None, None, expected_unpinned]


def test_pinning_after_jax_started_a_backend_is_refused():
    got = _in_fresh_process(
        "import json\n"
        "import jax\n"
        "from casebook.measure import pinning\n"
        "jax.numpy.ones(1).block_until_ready()\n"
        "try:\n"
        "    pinning.pin_process()\n"
        "    print(json.dumps('pinned'))\n"
        "except RuntimeError as error:\n"
        "    print(json.dumps(str(error)))")
    assert "before jax starts a backend" in got


@needs_affinity
def test_pinning_after_importing_jax_pins_xla_too():
    """What a job forked from the run's worker does: jax imported, no backend yet (and
    numpy's BLAS pool sized for one thread, as the worker imports it: a pool started on
    import would keep its threads where they were)."""
    allowed = os.sched_getaffinity(0)
    got = _in_fresh_process(
        "import json, os\n"
        "import jax.numpy as jnp\n"
        "from casebook.measure import pinning\n"
        "cpu = pinning.pin_for('cpu', {'pin_cpu': True})\n"
        "jnp.ones(4).block_until_ready()\n"
        "tasks = os.listdir('/proc/self/task')\n"
        "threads = {t: sorted(os.sched_getaffinity(int(t))) for t in tasks}\n"
        "print(json.dumps({'cpu': cpu, 'threads': threads}))",
        **dict.fromkeys(worker.ONE_THREAD, "1"))
    assert got["cpu"] == max(allowed) and len(got["threads"]) > 1
    assert all(cpus == [got["cpu"]] for cpus in got["threads"].values())


def test_a_verify_record_says_whether_a_host_stand_in_ran_for_its_kernel():
    from casebook.core import stand_ins

    def record(*executions):
        return {"checks": [{"execution": e} for e in executions] + [{"error": "not run"}]}
    interpreted, model = {"interpret": True}, {"interpret": False, "subject": "numerics model"}
    kernel = {"interpret": False, "device": "cpu"}  # XLA on the host: a speed result there
    assert stand_ins.verified_by_stand_in(record(interpreted, interpreted))
    assert stand_ins.verified_by_stand_in(record(model))
    assert not stand_ins.verified_by_stand_in(record(kernel))
    assert not stand_ins.verified_by_stand_in(record({"interpret": False, "subject": ""}))
    assert not stand_ins.verified_by_stand_in(record())
