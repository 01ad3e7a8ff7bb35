"""A fake tiled case (y = 2x, tile rows {"w": n}) and tile_choice records made with it:
what the autotune tests and the carry tests build their choices from."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from casebook.core import config, paths, records
from casebook.stages import autotune
from kernels import contract
from kernels.contract import Runnable
from tests.projects import MEASUREMENT

CASE_PATH = config.case_path("configs/cases", "splash_attention")  # hashed into the record
FAKE_SPEC = {"name": "splash_attention", "points": [{"name": "p", "params": {
    "n": 16, "dtype": "float32"}}], "tolerances": {"float32": {
        "atol": 1e-6, "rtol": 1e-6, "reason": "y = 2x is exact"}},
    "measurement": {"cache": "hot"}}
FAKE_FOUND = {"key": "tiles", "smem_limit_bytes": 232_448, "rejected": [], "tie_rule": "w",
              "hand": {"w": 1}, "kept": [
    {"tiles": {"w": n}, "smem_bytes": {"forward": 1024 * n}, "tie_order": [n]}
    for n in (1, 2)]}


def fake_plugin(wrong: set[int]) -> SimpleNamespace:
    """A case computing y = 2x with tile rows {"w": n}; rows in ``wrong`` compute 3x."""
    def kernel(variant, params, purpose, build_dir=None):
        factor = 3.0 if params["tiles"]["w"] in wrong else 2.0
        return Runnable(prepare=lambda inputs: (inputs["x"],), call=lambda x: factor * x,
                        sync=lambda out: None, fetch=lambda out: out,
                        execution=contract.execution("numpy"))

    return SimpleNamespace(
        make_inputs=lambda params, rng: {"x": rng.standard_normal(params["n"])},
        oracle=lambda params, inputs: 2 * inputs["x"], kernel=kernel,
        races_found=lambda: False, reset=lambda: None)


def write_choice(variant: str, point: str, params: dict[str, Any], tiles: dict[str, int] | None,
                 target: str = "h200", key: str = "tiles") -> Path:
    """A tile_choice record of splash attention at ``paths.tile_choice_record`` (relative to
    the working directory) that picked ``tiles`` (None: no candidate passed) for a point of
    ``params``: made by the autotune on the fake case, then given this point's fields."""
    out = Path(paths.tile_choice_record(target, "splash_attention", variant, point))
    autotune.choose(fake_plugin(wrong=set() if tiles else {1, 2}), FAKE_SPEC, CASE_PATH,
                    variant, "p", target, MEASUREMENT, FAKE_FOUND, str(out),
                    str(out.with_suffix(".samples")))
    record = {**json.loads(out.read_text()), "point": point, "params": params, "key": key,
              "pick": {"tiles": tiles} if tiles else None}
    records.check(out, "tile_choice", record)
    out.write_text(json.dumps(record))
    return out
