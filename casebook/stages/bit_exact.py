"""The bit-exact step: a port's output against the kernel it ports, bit for bit, at every
configuration of its case (``side_by_side`` with ``bit_exact: true`` in the case config).

The case's plug-in answers ``bit_exact(points, build_dir, seed)``: per point the elements
of the output and how many differ in their bits. A host that cannot run the kernels
(``NotRunnable``) gets a record saying so and why; that is not a failure.
"""

from __future__ import annotations

from typing import Any

from casebook.core import cases, config, paths, records
from casebook.core.errors import CasebookError
from casebook.stages.verify import draw_seed
from kernels.contract import NotRunnable


def run(case_dir: str, case: str, target: str, out: str) -> dict[str, Any]:
    """Compare the pair at every point of the case; write the ``bit_exact`` record."""
    spec = paths.for_target(config.load_case(case_dir, case), target)
    pair = spec.get("side_by_side", {})
    if not pair.get("bit_exact"):
        raise CasebookError(
            config.case_path(case_dir, case),
            "side_by_side.bit_exact",
            "not true: the case asks for no bit-exact comparison",
        )
    seed = draw_seed()
    body: dict[str, Any] = {
        "target": target,
        "case": case,
        "variant": pair["variant"],
        "against": pair["against"],
        "seed": seed,
    }
    try:
        compared = cases.load(case).bit_exact(
            [*spec["points"], *spec["build_only_points"]], paths.build_dir(case), seed
        )
    except NotRunnable as why:
        body.update(ran=False, not_run_reason=str(why), points=[])
    else:
        body.update(ran=True, points=compared, identical=all(p["differing"] == 0 for p in compared))
    return records.write(out, "bit_exact", body)
