"""Under jax 0.10 the interpreters' host callbacks take numpy arguments
(``numpy_callback_arguments``) and the Mosaic GPU interpreter's keep host values in numpy
(``interpreter_speed``): the same outputs bit for bit and the same race reports as with
jax's own device_put arguments and jax arrays, and every other io_callback untouched.
Under jax 0.11 nothing changes, and the race test runs there as it is."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import callback as jax_callback
from jax.experimental.pallas import mosaic_gpu as plgpu

from casebook.core import cases, interpreter_speed
from kernels import mgpu_interpret
from kernels.splash_attention import block_plan, mgpu_forward
from kernels.splash_attention.problems import inputs, mask_of

pytestmark = [pytest.mark.interpret, pytest.mark.host_rehearsal]


INSTALLED = mgpu_interpret.numpy_callback_arguments()
HOST_VALUES = interpreter_speed.host_values_in_callbacks(load=True)
only_where_installed = pytest.mark.skipif(
    not INSTALLED, reason="jax 0.11: the interpreters keep jax's own arguments")


@pytest.fixture
def with_jax_arguments(monkeypatch):
    """Put jax's own ``io_callback_impl`` back for the duration of a test."""
    mgpu_interpret.prepare_host_interpreter()

    def restore():
        if not INSTALLED:
            return
        monkeypatch.setattr(jax_callback, "io_callback_impl",
                            jax_callback.io_callback_impl.device_put_arguments)
    return restore


@pytest.fixture
def with_jax_values(monkeypatch):
    """Give the Mosaic GPU interpreter's callbacks jax.numpy back for a test."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks

    def restore():
        if HOST_VALUES:
            monkeypatch.setattr(gpu_callbacks, "jnp", gpu_callbacks.jnp.jnp)
    return restore


def test_host_values_are_installed_by_loading_a_case_that_interprets(monkeypatch):
    """Installed under jax 0.10 alone, by ``cases.load`` where the case imported Pallas
    Mosaic GPU, and idempotent; where no case imported it, nothing is installed."""
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks

    assert (jax.__version_info__ < (0, 11)) == HOST_VALUES
    monkeypatch.setattr(gpu_callbacks, "jnp", jnp)
    cases.load("splash_attention")
    assert isinstance(gpu_callbacks.jnp, interpreter_speed.HostNumpy) == HOST_VALUES
    assert interpreter_speed.host_values_in_callbacks() == HOST_VALUES
    if HOST_VALUES:
        assert gpu_callbacks.jnp.jnp is jnp and gpu_callbacks.jnp.float32 is jnp.float32
        assert gpu_callbacks.jnp.array is np.array and gpu_callbacks.jnp.int32 is np.int32
    monkeypatch.setattr(gpu_callbacks, "jnp", jnp)
    monkeypatch.delitem(sys.modules, interpreter_speed.PALLAS_MOSAIC_GPU)
    assert not interpreter_speed.host_values_in_callbacks()  # no case imported it
    assert gpu_callbacks.jnp is jnp


def _argument_type(module: str) -> type:
    """The type an io_callback whose function lives in ``module`` is called with."""
    seen = []

    def record(x):
        seen.append(type(x))
        return np.asarray(x)

    record.__module__ = module
    shape = jax.ShapeDtypeStruct((3,), jnp.int32)
    jax.block_until_ready(jax.jit(lambda x: jax.experimental.io_callback(record, shape, x))(
        jnp.arange(3, dtype=jnp.int32)))
    return seen[0]


def test_only_the_interpreters_callbacks_get_numpy_arguments():
    mgpu_interpret.prepare_host_interpreter()
    assert (jax.__version_info__ < (0, 11)) == INSTALLED
    for module in ("jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks",
                   "jax._src.pallas.mosaic.interpret.interpret_pallas_call"):
        got = _argument_type(module)
        assert got is np.ndarray if INSTALLED else issubclass(got, jax.Array), module
    assert issubclass(_argument_type(__name__), jax.Array)
    assert issubclass(_argument_type("jax._src.pallas.mosaic_gpu.interpreted_elsewhere"),
                      jax.Array)


@only_where_installed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("back_to_jax", ["arguments", "values"])
def test_a_kernel_computes_the_same_bits_either_way(rng, interpreter, with_jax_arguments,
                                                    with_jax_values, back_to_jax):
    """A warp-specialised forward (3 warpgroups, TMA, barriers, wgmma) on one set of
    inputs: numpy arguments and host values, then jax's arguments (or jax arrays in the
    callbacks); identical outputs, no race either way."""
    mask = mask_of("causal", 2, rng, 256)
    problem = mgpu_forward.Problem(2, 2, 256, 256, 64, 64, "float16")
    forward = jax.jit(mgpu_forward.make(
        problem, mgpu_forward.TuningConfig(128, 64, 2, compute_wgs=2),
        block_plan.plan(mask, 128, 64), interpret=interpreter))
    q, k, v = inputs(rng, 2, 2, 64, 64, "float16", 256)
    args = (jnp.asarray(q), jnp.swapaxes(k, 1, 2), jnp.asarray(v))
    fast = np.asarray(jax.block_until_ready(forward(*args)))
    assert not mgpu_interpret.races_found()
    {"arguments": with_jax_arguments, "values": with_jax_values}[back_to_jax]()
    slow = np.asarray(jax.block_until_ready(forward(*args)))
    assert not mgpu_interpret.races_found()
    assert np.isfinite(fast).all()
    assert np.array_equal(fast.view(np.uint16), slow.view(np.uint16))


def _tma_then_read(read_before_wait: bool, interpret):
    """Copy a tile into shared memory by TMA and write back twice it; the racy form
    reads the destination before waiting on the copy's barrier."""
    def body(x_gmem, o_gmem, smem, barrier):
        plgpu.copy_gmem_to_smem(x_gmem, smem, barrier)
        early = smem[...] if read_before_wait else None
        plgpu.barrier_wait(barrier)
        late = smem[...]
        smem[...] = late * 2 if early is None else early * 0 + late * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                        scratch_types=[plgpu.SMEM((64, 128), jnp.float32),
                                       plgpu.Barrier(num_arrivals=1)],
                        interpret=interpret)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arguments", ["numpy", "jax", "jax values"])
def test_a_read_before_the_wait_is_reported_either_way(rng, arguments, with_jax_arguments,
                                                       with_jax_values):
    if arguments == "jax":
        with_jax_arguments()
    if arguments == "jax values":
        with_jax_values()
    x = rng.standard_normal((64, 128)).astype(np.float32)
    for racy in (False, True):
        mgpu_interpret.reset_interpreter()
        out = jax.block_until_ready(
            _tma_then_read(racy, mgpu_interpret.interpret_params())(jnp.asarray(x)))
        assert mgpu_interpret.races_found() == racy
        np.testing.assert_array_equal(np.asarray(out), 2 * x)
    mgpu_interpret.reset_interpreter()
