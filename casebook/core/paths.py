"""Every file name the pipeline reads or writes, in one place.

Results are keyed by target (the device class that produced them) and case, as asv keeps
one results folder per machine::

    results/<target>/env.json                                  environment as found
    results/<target>/host.json                                 hardware as found
    results/<target>/noise_floor.json                          the host's A/A noise floor
    results/<target>/gpu_window.json                           a GPU window's steps
    results/<target>/logs/...                                  ... and its logs (imported)
    results/<target>/<case>/build/<variant>.json               what was built
    results/<target>/<case>/build/<variant>/<point>.json       ... at one point
    results/<target>/<case>/verify/<variant>/<point>.json      oracle check
    results/<target>/<case>/time/<variant>/<point>.json        measurement
    results/<target>/<case>/time/<variant>/<point>.samples.csv raw samples
    results/<target>/<case>/ablation/<ablation>/<point>.json   an ablation lowered and
                                                               timed (+ .samples.csv)
    results/<target>/<case>/baseline/<baseline>/<point>.json   baseline measurement
    results/<target>/<case>/compare/<point>.json (+ .samples.csv) kernels against
                                                               baselines, interleaved
    results/<target>/<case>/tiles/<variant>/<point>.json       autotune: one point's pick
    results/<target>/<case>/tiles/<variant>/<point>.samples/   ... each candidate's samples
    results/<target>/<case>/tiles/<variant>/<point>.candidates/  ... until the pick is made
    results/<target>/<case>/tiles.yaml                         the target's tile table
    results/figures/<case>/<target>/<figure>.svg (+ .json)     figures and their sidecars
    results/figures/<case>/<target>/figures.json               what was drawn, or withheld
    results/<target>/noise_floor.json                          the host's A/A noise floor
    site/public/index.html, <case>.html, methods.html          the site's pages
    site/public/static/, site/public/figures/<case>/<target>/  its style and figures
    site/public/data/<target>/...                              raw records, as under results/
    build/site/<part>/, build/site/pages/<case>.json           the site's parts before
                                                               publishing; how each page went
    build/<case>/...                                           compilers' outputs and caches
    build/plugin_answers/<case>.json                           the case plug-in's answers
                                                               to the config check

Paths are relative to the working directory (Snakemake's ``--directory``); sources
(configs, schemas, kernels, templates) are relative to SOURCE_ROOT. Functions accept
Snakemake wildcard strings such as ``"{target}"`` as well as concrete names.
"""

from __future__ import annotations

import os
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = SOURCE_ROOT / "configs" / "schemas"
RECORD_SCHEMA = SCHEMA_DIR / "records.schema.yaml"
CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"
CASE_SCHEMA = SCHEMA_DIR / "case.schema.yaml"
ENV_DIR = SOURCE_ROOT / "env"
KERNELS_DIR = SOURCE_ROOT / "kernels"
TEMPLATE_DIR = SOURCE_ROOT / "site" / "templates"
STATIC_DIR = SOURCE_ROOT / "site" / "static"
LIBRARY_DIR = SOURCE_ROOT / "casebook"
PEAKS = SOURCE_ROOT / "configs" / "peaks.yaml"  # each target GPU's peaks: the speed of light
# The modules whose docstrings the methods page quotes (``methods.QUOTED``): its inputs.
METHODS_QUOTES = tuple(LIBRARY_DIR / name for name in (
    "stages/verify.py", "measure/clocks.py", "measure/engine.py", "measure/guards.py",
    "measure/pinning.py", "measure/stats.py", "measure/stopping.py",
    "core/speed_of_light.py", "report/history.py"))

# The measurement engine's own benchmark records the methods page states: calibration
# (A/A false verdicts, effects found) and rerun coverage (benchmarks/, results committed).
BENCHMARK_RECORDS = "benchmarks/results"
BENCHMARK_RESULTS = SOURCE_ROOT / BENCHMARK_RECORDS
PROTOCOL_CHECKS = tuple(BENCHMARK_RESULTS / f"{name}.json" for name in (
    "calibration_paired", "calibration_separate", "rerun_coverage"))

RESULTS = "results"
BUILD = "build"
FIGURES = f"{RESULTS}/figures"
SITE = "site/public"
STAGE = f"{BUILD}/site"
LOGS = "logs"


def source(path: str | Path) -> str:
    """A source file as a rule input: relative to the working directory, so that no input
    names the folder the project sits in (a moved checkout reruns nothing)."""
    return os.path.relpath(path)


def lock_file(platform: str) -> Path:
    """The hash-pinned lock of one platform (``cpu`` or ``cuda``)."""
    return ENV_DIR / f"{platform}.lock"


# Reference packages installed without their dependencies, for their sources only.
REFERENCE_LOCK = ENV_DIR / "reference.lock"


def kernel_dir(case: str) -> Path:
    return KERNELS_DIR / case


def build_dir(case: str) -> str:
    """A case's compiler outputs and caches (cubins, binaries); not committed."""
    return f"{BUILD}/{case}"


def plugin_answers(case: str) -> str:
    """What the case's plug-in answered the config check, by its sources' hash."""
    return f"{BUILD}/plugin_answers/{case}.json"


def target_dir(target: str) -> str:
    return f"{RESULTS}/{target}"


def env_record(target: str) -> str:
    return f"{RESULTS}/{target}/env.json"


def host_record(target: str) -> str:
    return f"{RESULTS}/{target}/host.json"


def noise_floor_record(target: str) -> str:
    return f"{RESULTS}/{target}/noise_floor.json"


def gpu_window_record(target: str) -> str:
    """What the last GPU window on ``target`` ran, step by step (benchmarks/gpu_run.sh)."""
    return f"{RESULTS}/{target}/gpu_window.json"


def build_record(target: str, case: str, variant: str) -> str:
    return f"{RESULTS}/{target}/{case}/build/{variant}.json"


def lowering_record(target: str, case: str, variant: str, point: str) -> str:
    return f"{RESULTS}/{target}/{case}/build/{variant}/{point}.json"


def verify_record(target: str, case: str, variant: str, point: str) -> str:
    return f"{RESULTS}/{target}/{case}/verify/{variant}/{point}.json"


def check_power_record(target: str, case: str, point: str) -> str:
    return f"{RESULTS}/{target}/{case}/check_power/{point}.json"


def check_power_trials_dir(record: str) -> str:
    """Each trial's outcome while a check-power record is made (check_power_trial
    records): not an output of the job, so a job cut short resumes from them."""
    return record.removesuffix(".json") + ".trials"


def time_record(target: str, case: str, variant: str, point: str) -> str:
    return f"{RESULTS}/{target}/{case}/time/{variant}/{point}.json"


def ablation_record(target: str, case: str, ablation: str, point: str) -> str:
    """A variant with one part switched off, lowered and timed at one point."""
    return f"{RESULTS}/{target}/{case}/ablation/{ablation}/{point}.json"


def baseline_record(target: str, case: str, baseline: str, point: str) -> str:
    return f"{RESULTS}/{target}/{case}/baseline/{baseline}/{point}.json"


def history_dir(target: str) -> str:
    """``target``'s results across commits (casebook/report/history.py)."""
    return f"{RESULTS}/{target}/history"


def history_entry(target: str, revision: str, case: str, figure: str) -> str:
    """One figure (``time/<variant>/<point>``, ``baseline/<name>/<point>``) as measured
    at one revision."""
    return f"{history_dir(target)}/{revision}/{case}/{figure}.json"


def bit_exact_record(target: str, case: str) -> str:
    """A port's output against the kernel it ports, bit for bit, at every point."""
    return f"{RESULTS}/{target}/{case}/bit_exact.json"


def compare_record(target: str, case: str, point: str) -> str:
    """The point's variants and baselines measured interleaved, and their paired ratios."""
    return f"{RESULTS}/{target}/{case}/compare/{point}.json"


def for_target(spec: dict, target: str) -> dict:
    """The case config ``spec`` as ``target`` runs it: its build-only points measured on
    ``target`` (``measured_on``) among its points. Every job and page of a target reads
    its points through this."""
    measured = [p for p in spec.get("build_only_points", [])
                if target in p.get("measured_on", ())]
    if not measured:
        return spec
    return {**spec, "points": [*spec["points"], *measured],
            "build_only_points": [p for p in spec["build_only_points"] if p not in measured]}


def point_records(spec: dict, target: str, point: str) -> dict[str, dict[str, str]]:
    """The time, verify and baseline records of one point, by kind and name: what the
    point's comparison reads."""
    case, variants = spec["name"], [v["name"] for v in spec["variants"]]
    return {"time": {v: time_record(target, case, v, point) for v in variants},
            "verify": {v: verify_record(target, case, v, point) for v in variants},
            "baseline": {b["name"]: baseline_record(target, case, b["name"], point)
                         for b in spec["baselines"]}}


def case_records(spec: dict, target: str) -> list[str]:
    """Every record ``target`` produces for the case of config ``spec``: the noise floor,
    then its builds, check power, verifications, times, ablations, baselines and
    comparisons, and a bit-exact comparison where the case asks for one."""
    spec, case = for_target(spec, target), spec["name"]
    out = [noise_floor_record(target)]
    out += [build_record(target, case, v["name"]) for v in spec["variants"]]
    for p in spec["points"]:
        out.append(check_power_record(target, case, p["name"]))
        for v in spec["variants"]:
            out += [verify_record(target, case, v["name"], p["name"]),
                    time_record(target, case, v["name"], p["name"])]
        out += [ablation_record(target, case, a["name"], p["name"])
                for a in spec.get("ablations", [])]
        out += [baseline_record(target, case, b["name"], p["name"]) for b in spec["baselines"]]
        out.append(compare_record(target, case, p["name"]))
    if spec.get("side_by_side", {}).get("bit_exact"):
        out.append(bit_exact_record(target, case))
    return out


BUILD_ONLY_SUFFIX = ".build_only.json"


def build_only_lowerings(target: str, case: str, variant: str) -> str:
    """The lowerings of a variant's build-only points, made in one job."""
    return f"{RESULTS}/{target}/{case}/build/{variant}{BUILD_ONLY_SUFFIX}"


def lowering_records(spec: dict, target: str, variant: str) -> list[str]:
    """The lowerings a variant's build record gathers: one record per verified point (its
    verify reads it), then one holding every build-only point, if the case has any."""
    spec = for_target(spec, target)
    per_point = [lowering_record(target, spec["name"], variant, p["name"])
                 for p in spec["points"]]
    return per_point + ([build_only_lowerings(target, spec["name"], variant)]
                        if spec["build_only_points"] else [])


def case_products(spec: dict, target: str) -> list[str]:
    """Every file ``target``'s jobs keep for the case: its records, the lowerings they
    gather and the samples behind its times and baselines."""
    spec = for_target(spec, target)
    case, points = spec["name"], [p["name"] for p in spec["points"]]
    variants = [v["name"] for v in spec["variants"]]
    baselines = [b["name"] for b in spec["baselines"]]
    measured = [time_record(target, case, v, p) for v in variants for p in points]
    measured += [ablation_record(target, case, a["name"], p)
                 for a in spec.get("ablations", []) for p in points]
    measured += [baseline_record(target, case, b, p) for b in baselines for p in points]
    measured += [compare_record(target, case, p) for p in points]
    return [*case_records(spec, target), *map(samples_table, measured),
            *(f for v in variants for f in lowering_records(spec, target, v))]


def tile_choice_record(target: str, case: str, variant: str, point: str) -> str:
    return f"{RESULTS}/{target}/{case}/tiles/{variant}/{point}.json"


def tile_samples_dir(record: str) -> str:
    """The candidates' raw-sample tables of a tile_choice record, one file each."""
    return record.removesuffix(".json") + ".samples"


def tile_candidates_dir(record: str) -> str:
    """Each candidate's outcome while a tile choice is made (tile_candidate records and
    their samples): not an output of the job, so a job cut short resumes from them."""
    return record.removesuffix(".json") + ".candidates"


def tile_table(target: str, case: str) -> str:
    """The tile table the autotune rule generates for ``target`` (GPU targets only)."""
    return f"{RESULTS}/{target}/{case}/tiles.yaml"


def samples_table(record: str) -> str:
    """The raw-sample table kept beside a time or baseline record."""
    return record.removesuffix(".json") + ".samples.csv"


def figure_manifest(case: str, target: str) -> str:
    return f"{FIGURES}/{case}/{target}/figures.json"


def figure(case: str, target: str, name: str) -> str:
    return f"{FIGURES}/{case}/{target}/{name}.svg"


def sidecar(figure_path: str) -> str:
    return figure_path.removesuffix(".svg") + ".json"


def present_targets() -> list[str]:
    """Targets with a host record under results/: this machine's and any committed."""
    return sorted(p.parent.name for p in Path(RESULTS).glob("*/host.json"))


def site_part(part: str) -> str:
    """A part of the site rendered apart (``pages/<case>``, ``index``, ``methods``,
    ``records``, ``static``): a folder laid out as the site, merged into it when it is
    published; each file of the site comes from one part."""
    return f"{STAGE}/{part}"


def page_part(case: str) -> str:
    return site_part(f"pages/{case}")


def page_status(case: str) -> str:
    """The record of how a case's page was rendered: published, or failed and why."""
    return f"{STAGE}/pages/{case}.json"


def target_records(target: str) -> tuple[str, ...]:
    """A target's records that every page links (the site's ``records`` part holds them)."""
    return env_record(target), host_record(target), noise_floor_record(target)


def site_index(root: str = SITE) -> str:
    return f"{root}/index.html"


def site_page(case: str, root: str = SITE) -> str:
    return f"{root}/{case}.html"


def site_methods(root: str = SITE) -> str:
    return f"{root}/methods.html"


def site_static(name: str, root: str = SITE) -> str:
    return f"{root}/static/{name}"


def site_figure(case: str, target: str, name: str, root: str = SITE) -> str:
    return f"{root}/figures/{case}/{target}/{name}.svg"


def site_data(record: str, root: str = SITE) -> str:
    """Where the published copy of a file under results/ goes (same relative path)."""
    return f"{root}/data/{Path(record).relative_to(RESULTS).as_posix()}"


def site_href(published: str, root: str = SITE) -> str:
    """A published file's link from a page at the site's root."""
    return Path(published).relative_to(root).as_posix()


def log(stage: str, *keys: str) -> str:
    return f"{LOGS}/{stage}/" + "/".join(keys) + ".log"
