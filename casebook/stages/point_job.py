"""What every per-point job reads before its own work: one context, loaded once.

The lower, verify, check_power, time, baseline and autotune jobs each start from the case
config, the case's plug-in, one point's params and, for a variant, the target's tile-table
row applied to them; :func:`load` makes that :class:`PointJob`, checking every name
against the config (an unknown variant or point names the case file and key).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType
from typing import Any

from casebook.core import cases, config, paths, provenance
from casebook.stages import tile_table


@dataclasses.dataclass(frozen=True)
class PointJob:
    case: str
    target: str
    point: str
    variant: str | None  # None: a job of the case's point, not of one variant (a baseline)
    spec: dict[str, Any]  # the case config
    path: Path  # the case file, where its errors point
    plugin: ModuleType  # the case's package (kernels.contract)
    params: dict[str, Any]  # the point's params as the case file states them
    build_only: bool  # a point lowered only, never verified or timed
    tuned: dict[str, Any]  # params with the target's tile-table row applied
    tiles_from: dict[str, Any] | None  # where the row came from, if one was applied

    @property
    def build_dir(self) -> str:
        """The folder the pipeline keeps this case's builds in."""
        return paths.build_dir(self.case)

    def stamp(self) -> dict[str, Any]:
        """The fields that open a variant job's record: what, where, made from which
        sources, with which tile choice."""
        return {"target": self.target, "case": self.case, "variant": self.variant,
                "point": self.point, "params": self.params,
                "sources_sha256": provenance.job_sha256(self.spec, self.variant, self.point),
                **({"tile_table": self.tiles_from} if self.tiles_from else {})}


def load(case_dir: str, case: str, target: str, point: str, variant: str | None = None,
         build_only_points: bool = False, tuned: bool = True) -> PointJob:
    """The context of one job. ``build_only_points``: ``point`` may be a build-only point;
    ``tuned``: apply the tile choice autotune made here (not for autotune, which makes it)."""
    spec = paths.for_target(config.load_case(case_dir, case), target)
    path = config.case_path(case_dir, case)
    if variant is not None:
        config.find(spec["variants"], variant, path, "variants")
    entry, build_only = _point(spec, point, path, build_only_points)
    params = entry["params"]
    tuned, tiles_from = (tile_table.apply(target, case, variant, point, params)
                         if variant is not None and tuned else (params, None))
    return PointJob(case=case, target=target, point=point, variant=variant, spec=spec,
                    path=path, plugin=cases.load(case), params=params,
                    build_only=build_only, tuned=tuned, tiles_from=tiles_from)


def _point(spec: dict[str, Any], point: str, path: Path,
           build_only_points: bool) -> tuple[dict[str, Any], bool]:
    """The config entry of ``point`` and whether it is build-only."""
    if build_only_points and not any(p["name"] == point for p in spec["points"]):
        return config.find(spec["build_only_points"], point, path, "build_only_points"), True
    return config.find(spec["points"], point, path, "points"), False
