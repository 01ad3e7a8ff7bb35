"""Ablations of the Hopper forward (``mgpu``): the port's kernel at a point's tiles with one
part of its computation switched off, to show where the time goes. An ablation computes
a wrong result on purpose (or the right one more slowly); it is never verified as a port.

- ``mgpu_no_mask_evaluation``: partial blocks computed as full blocks (no mask applied);
- ``mgpu_no_rescaling``: the online softmax never rescales O and the row sum;
- ``mgpu_one_compute_wg``: one compute warpgroup for all the q block's rows where the
  kernel runs two consumers and a producer (it then issues its own TMA copies);
- ``mgpu_one_stage``: a one-stage TMA ring, so no copy overlaps the compute.

An ablation whose part the kernel does not have at a point (one warpgroup already, one
stage already) does not apply there: ``refusal`` says why.
"""

from __future__ import annotations

import dataclasses

from kernels.splash_attention import mgpu_forward
from kernels.splash_attention.mgpu_forward import Switches, TuningConfig


@dataclasses.dataclass(frozen=True)
class Ablation:
    of: str  # the verified variant it switches a part of off
    switches_off: str  # the part, in words
    switches: Switches = mgpu_forward.ALL_ON

    def tiles(self, config: TuningConfig) -> TuningConfig:
        """The tiles the ablation runs at, from the verified kernel's."""
        return config


@dataclasses.dataclass(frozen=True)
class OneComputeWarpgroup(Ablation):
    def tiles(self, config: TuningConfig) -> TuningConfig:
        return dataclasses.replace(config, compute_wgs=1)


@dataclasses.dataclass(frozen=True)
class OneStage(Ablation):
    def tiles(self, config: TuningConfig) -> TuningConfig:
        return dataclasses.replace(config, stages=1)


ABLATIONS = {
    "mgpu_no_mask_evaluation": Ablation(
        "mgpu", "mask evaluation (partial blocks computed as full)",
        Switches(mask_evaluation=False)),
    "mgpu_no_rescaling": Ablation(
        "mgpu", "online-softmax rescaling of O and the row sum", Switches(rescaling=False)),
    "mgpu_one_compute_wg": OneComputeWarpgroup(
        "mgpu", "the second compute warpgroup and the producer warpgroup"),
    "mgpu_one_stage": OneStage("mgpu", "the TMA ring's prefetch (one stage)"),
}


def find(name: str) -> Ablation:
    if name not in ABLATIONS:
        raise ValueError(f"unknown splash_attention ablation {name!r}; known: "
                         f"{sorted(ABLATIONS)}")
    return ABLATIONS[name]


def refusal(name: str, config: TuningConfig) -> str | None:
    """Why ablation ``name`` changes nothing at the verified kernel's tiles ``config``."""
    ablation = find(name)
    if isinstance(ablation, OneComputeWarpgroup) and config.compute_wgs == 1:
        return "the kernel runs one compute warpgroup at this point's tiles already"
    if isinstance(ablation, OneStage) and config.stages == 1:
        return "the kernel's TMA ring has one stage at this point's tiles already"
    return None


def configured(name: str, config: TuningConfig) -> tuple[TuningConfig, Switches]:
    """The ablation's tiles and switches at the verified kernel's tiles ``config``."""
    ablation = find(name)
    why = refusal(name, config)
    if why:
        raise ValueError(f"{name} does not apply: {why}")
    return ablation.tiles(config), ablation.switches
