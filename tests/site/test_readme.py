"""README.md is the front door (issue 44): at most 150 lines, one short row per case
linking to that case's README, where the details live."""

from __future__ import annotations

from casebook.core import config, paths

README = (paths.SOURCE_ROOT / "README.md").read_text().splitlines()


def test_the_readme_is_a_front_door_of_at_most_150_short_lines():
    assert len(README) <= 150
    long = [i + 1 for i, line in enumerate(README) if len(line) > 400]
    assert not long, f"README.md lines over 400 characters: {long}"


def test_each_case_has_one_row_linking_to_its_readme():
    for case in config.load_global()["cases"]:
        link = f"[{case}](kernels/{case}/README.md)"
        rows = [line for line in README if line.startswith(f"| {link} |")]
        assert len(rows) == 1, f"README.md: no single row for {case}"
        assert (paths.SOURCE_ROOT / "kernels" / case / "README.md").is_file()
