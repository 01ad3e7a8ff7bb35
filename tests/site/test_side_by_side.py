"""The page's side-by-side of a port and the kernel it ports (casebook.report.page_tables), on the
SASS facts of case 03's two captured kernels (tests/data/grouped_gemm_sass/)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from casebook.core import config
from casebook.core.errors import CasebookError
from casebook.report import page_tables
from kernels.grouped_gemm_fp8_bf16 import compile_port, sass, upstream

DATA = Path(__file__).parents[1] / "data" / "grouped_gemm_sass"
PORT = sass.facts(
    sass.kernel((DATA / "port_scale_only.sass").read_text(), compile_port.KERNEL_NAME)
)
EX69 = sass.facts(
    sass.kernel((DATA / "ex69_scale_only.sass").read_text(), upstream.KERNEL_NAMES["scale_only"])
)


def build(facts: dict, stages: int, points=("p1", "p2")) -> dict:
    return {
        "points": [
            {"point": p, "artifacts": [{"facts": {"stages": stages, "sass": facts}}]}
            for p in points
        ]
    }


def table(differences: list[dict], port_stages: int = 8) -> str:
    ev = SimpleNamespace(
        target="cpu", builds={"port": build(PORT, port_stages), "ref": build(EX69, 19)}
    )
    spec = {"side_by_side": {"variant": "port", "against": "ref", "differences": differences}}
    return page_tables.side_by_side(ev, spec)


def rows(html: str) -> list[str]:
    return html.split("<tr>")[2:]


def row(html: str, fact: str) -> str:
    (found,) = [r for r in rows(html) if f">{fact}<" in r]
    return found


def test_a_difference_nobody_explained_is_a_failure():
    html = table([])
    assert "UNEXPLAINED" in row(html, "stages") and ' fail"' in row(html, "stages")
    assert ">8<" in row(html, "stages") and ">19<" in row(html, "stages")
    # The same fact at both points is one row, for all of them.
    assert ">all 2<" in row(html, "stages")
    same = row(html, "fp8_unpacks_per_k_tile")
    assert ">same<" in same and ' fail"' not in same


def test_an_explained_difference_passes_and_an_open_one_fails():
    html = table(
        [
            {"fact": "stages", "kind": "forced", "reason": "the DSL says so"},
            {"fact": "hgmma_in_kernel", "kind": "open", "reason": "not done yet"},
            {"fact": "mainloop_instructions", "kind": "not_slower", "reason": "fewer"},
        ]
    )
    assert "forced: the DSL says so" in row(html, "stages")
    assert ' fail"' not in row(html, "stages")
    assert "not slower: fewer" in row(html, "mainloop_instructions")
    assert ' fail"' not in row(html, "mainloop_instructions")
    assert "OPEN: not done yet" in row(html, "hgmma_in_kernel")
    assert ' fail"' in row(html, "hgmma_in_kernel")


def test_an_explanation_of_a_fact_that_no_longer_differs_is_stale():
    html = table([{"fact": "stages", "kind": "open", "reason": "8 against 19"}], port_stages=19)
    same, stale = [r for r in rows(html) if ">stages<" in r]
    assert ">same<" in same and ' fail"' not in same
    assert "STALE" in stale and ' fail"' in stale


def test_case_03_explains_every_difference_of_its_captured_kernels():
    spec = config.load_case("configs/cases", "grouped_gemm_fp8_bf16")
    explained = {d["fact"] for d in spec["side_by_side"]["differences"]}
    differing = {k for k in PORT if PORT[k] != EX69[k]}
    assert differing and differing <= explained


def test_a_side_by_side_names_variants_of_its_case(tmp_path):
    spec = config.read_yaml(Path("configs/cases/grouped_gemm_fp8_bf16.yaml"))
    spec["side_by_side"]["against"] = "no_such_variant"
    folder = tmp_path / "cases"
    folder.mkdir()
    (folder / "grouped_gemm_fp8_bf16.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(CasebookError, match=r"side_by_side\.against"):
        config.load_case(str(folder), "grouped_gemm_fp8_bf16")
