# Shared by every stage: the validated cases, the targets measured, input functions.
import json
import os
import re
import sys
from pathlib import Path

# Snakemake puts this checkout first on sys.path; the scripts, separate interpreters, get it
# first on PYTHONPATH, so a copy of the workflow runs its own code, not an installed one.
os.environ.update(
    PYTHONPATH=os.pathsep.join([workflow.basedir, *filter(None, [os.environ.get("PYTHONPATH")])])
)

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from casebook.run import chip_holder, local_scheduler, worker
from casebook.core import config as case_config, paths, provenance, stand_ins
from casebook.stages import hostcapture, tile_table
from casebook.report import verdict
from casebook.core.errors import RUN_PID, CasebookError

# Each job ends when this process does, even one killed while its job was starting up.
os.environ[RUN_PID] = str(os.getpid())
SERVERS = []  # (stop, process) of the run's worker and chip holder, once onstart started them
# A job that got fewer cores than the run knows it ran beside others (time_threads); a
# run given no cores (a cluster's, by --jobs) leaves it to each job's own Snakemake.
try:
    local_scheduler.publish_cores(workflow.cores)
except WorkflowError:
    pass
# Jobs on the device take it one at a time locally (local_scheduler.one_gpu_job_at_a_time).
local_scheduler.one_gpu_job_at_a_time(workflow)

try:
    # Every config error before any job: one line naming the one file (or --config) that
    # set the bad key, then Snakemake's own validate; each case checked whole (load_case).
    _given = workflow.config_settings  # applied in order: ours, --configfile, --config
    _own = [] if _given.replace_workflow_config else workflow.configfiles[len(_given.configfiles):]
    case_config.validate_global(config, case_config.global_sources(
        [*_own, *_given.configfiles], _given.config))
    validate(config, str(paths.CONFIG_SCHEMA))
    CASES = {name: case_config.load_case(config["case_dir"], name) for name in config["cases"]}
    # The targets this run produces records for: configured, or this machine's own.
    MEASURED = hostcapture.measured_targets(config)
except CasebookError as error:  # not WorkflowError, which Snakemake frames in many lines
    print(f"casebook: error: {error}", file=sys.stderr)
    raise SystemExit(1) from None

# Records of other targets (committed from other machines) are inputs, never outputs.
TARGETS = sorted(set(paths.present_targets()) | set(MEASURED))


def _names(group):
    return "|".join(sorted({i["name"] for c in CASES.values() for i in c[group]}))


wildcard_constraints:
    target="|".join(map(re.escape, MEASURED)),
    shown_target="|".join(map(re.escape, TARGETS)),
    case="|".join(CASES),
    variant=_names("variants"),
    point="|".join(filter(None, [_names("points"), _names("build_only_points")])),
    baseline=_names("baselines"),
    ablation=_names("ablations"),


def case_file(wildcards):
    return paths.source(case_config.case_path(config["case_dir"], wildcards.case))


def lock_platform(target):
    """The lock a target's environment is checked against: cuda on a GPU, else cpu (a TPU
    host's Python and jax are the CPU lock's)."""
    return "cuda" if target in hostcapture.GPU_CLASSES.values() else "cpu"


def case_inputs(wildcards):
    """What a case's records depend on: the kernel sources the case imports, the
    environment. The case config enters through each job's own slice (job_config)."""
    return [
        *map(paths.source, provenance.kernel_sources(wildcards.case)),
        paths.env_record(wildcards.target),
        paths.host_record(wildcards.target),
    ]


def job_config(*names):
    """A param: the slice of the case config a job reads (provenance.job_slice), by the
    wildcards ``names``; editing one point's entry reruns that point's jobs alone."""

    def slice_of(wildcards):
        picked = {name: wildcards[name] for name in names}
        return json.dumps(provenance.job_slice(CASES[wildcards.case], **picked), sort_keys=True)

    return slice_of


def ablated(wildcards):
    """The variant the ablation switches a part of off (its config entry's ``of``)."""
    return case_config.find(CASES[wildcards.case]["ablations"], wildcards.ablation,
                            case_file(wildcards), "ablations")["of"]


def ablated_verify(wildcards):
    """The verify record of the variant the ablation switches a part of off."""
    return paths.verify_record(wildcards.target, wildcards.case, ablated(wildcards),
                               wildcards.point)


def ablation_config(wildcards):
    """A param: the ablation's slice of the case config (provenance.job_slice)."""
    return json.dumps(provenance.job_slice(CASES[wildcards.case], ablated(wildcards),
                                           wildcards.point, ablation=wildcards.ablation),
                      sort_keys=True)


def build_only_config(wildcards):
    """A param: each build-only point's slice of the case config (job_config), so that
    editing a verified point leaves the build-only lowerings alone."""
    spec = CASES[wildcards.case]
    return json.dumps([provenance.job_slice(spec, wildcards.variant, p["name"])
                       for p in spec["build_only_points"]], sort_keys=True)


def tile_choice_input(wildcards):
    """The tile_choice records (made by autotune on this target) that apply to this job's
    variant(s) at its point(s), where they exist: one point's choice being remade reruns
    that point's jobs alone (casebook.stages.tile_table)."""
    spec = paths.for_target(CASES[wildcards.case], wildcards.target)
    if hasattr(wildcards, "variant"):
        variants = [wildcards.variant]
    elif hasattr(wildcards, "ablation"):
        variants = [ablated(wildcards)]
    else:  # a comparison: every variant it measures
        variants = [v["name"] for v in spec["variants"]]
    points = ([wildcards.point] if hasattr(wildcards, "point")
              else [p["name"] for p in spec["build_only_points"]])
    tuned = set(autotuned(wildcards.case, wildcards.target))
    found = [paths.tile_choice_record(wildcards.target, wildcards.case, v, p)
             for v in variants if v in tuned for p in points]
    return [f for f in found if os.path.exists(f)]


# What a target's jobs (env, host, build, verify, time, baseline) ask a cluster for
# (config `cluster`); a GPU target's jobs then run only on nodes of its GPU kind.
def target_gpus(wildcards):
    return config["cluster"][wildcards.target]["gpus"]


def target_constraint(wildcards):
    """The node feature of the target's GPU kind; None (no --constraint) when empty."""
    return config["cluster"][wildcards.target]["constraint"] or None


def measure_threads(wildcards):
    """A measurement takes the whole machine locally; on a cluster, measure_cpus cores."""
    if workflow.non_local_exec or workflow.remote_exec:
        return config["cluster"]["measure_cpus"]
    return workflow.cores


def time_threads(wildcards, input):
    """A measurement's cores (measure_threads), but locally one where nothing is measured
    (its kernel did not pass verification: not run here, or failed) or where what is
    measured is a host stand-in for the kernel on target cpu (``stand_ins.is_stand_in``: an
    interpret-mode kernel, a numerics model): its host time is no speed result, so it runs
    beside other jobs, and its record says so (``shared_host``). Until its verify record
    exists (or while it cannot be read: the time job reports that) it asks for the whole
    machine."""
    local = not (workflow.non_local_exec or workflow.remote_exec)
    verified = _verify_record(input.verify) if local else None
    if verified is not None and (not verified.get("passed", True) or (
            wildcards.target == "cpu" and _stands_in(verified))):
        return 1
    return measure_threads(wildcards)


def _verify_record(path):
    """Read without the schema (the verify record is checked by the time job itself):
    Snakemake asks for every time job's threads each time it builds the DAG."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _stands_in(verified):
    try:
        return stand_ins.verified_by_stand_in(verified)
    except (KeyError, TypeError, AttributeError):
        return False


def point_records(wildcards):
    """A point's time, verify and baseline records: what its comparison reads
    (paths.point_records)."""
    found = paths.point_records(CASES[wildcards.case], wildcards.target, wildcards.point)
    return [path for kind in found.values() for path in kind.values()]


def case_records(case, target):
    """Every record ``target`` produces for ``case``."""
    return paths.case_records(CASES[case], target)


def case_products(case):
    """What a run keeps for ``case``: each measured target's records, lowerings and
    samples, each target's figure manifest, its staged page. Named as targets: Snakemake
    remakes a missing file only when a job after it must run, and a killed job's outputs
    are deleted, so without this the resume of a run killed in its only job would find
    nothing to do."""
    return [*(f for t in MEASURED for f in paths.case_products(CASES[case], t)),
            *case_manifests(case), paths.page_part(case), paths.page_status(case)]


def case_manifests(case):
    return [paths.figure_manifest(case, t) for t in TARGETS]


def randomized_records(case):
    """The benchmark records of randomized checks the case's page cites."""
    return [paths.source(paths.SOURCE_ROOT / c["record"])
            for c in CASES[case].get("randomized_checks", [])]


def figure_inputs(wildcards):
    if wildcards.shown_target in MEASURED:
        return [*case_records(wildcards.case, wildcards.shown_target),
                *randomized_records(wildcards.case)]
    # Another machine's records: rendered as found, never regenerated.
    target = wildcards.shown_target
    found = Path(paths.target_dir(target), wildcards.case).rglob("*.json")
    floor = [f for f in [paths.noise_floor_record(target)] if Path(f).exists()]
    return [paths.env_record(target), paths.host_record(target), *floor, *sorted(map(str, found)),
            *randomized_records(wildcards.case)]


def autotuned(case, target):
    """The variants of ``case`` whose tile choice is autotuned on ``target`` (config
    `autotune`: `variants` on a GPU, `tpu_variants` on a TPU)."""
    return tile_table.tuned_variants(CASES[case], target)


def autotune_tables(wildcards):
    if "cpu" in MEASURED:
        raise WorkflowError(f"casebook: {tile_table.CPU_REFUSAL}")
    tables = [paths.tile_table(t, case) for t in MEASURED for case in CASES
              if autotuned(case, t)]
    if not tables:
        raise WorkflowError(f"casebook: no case of this config has `autotune` variants for "
                            f"target(s) {', '.join(MEASURED)}")
    return tables


def history_files(wildcards):
    """The case's entries in each target's store of results across commits, as found:
    committed or imported ones; a run's own are kept by its time jobs, whose records the
    page reads anyway."""
    return sorted(str(p) for target in TARGETS
                  for p in Path(paths.history_dir(target)).glob(f"*/{wildcards.case}/*/*/*.json"))


def figure_files(wildcards):
    """Each target's figure manifest, and the figures and sidecars it lists once the
    figures checkpoint has made it: a hand-edited sidecar reruns the page. What a corrupt
    manifest lists cannot be read here; the page job then reports it."""
    files = []
    for target in TARGETS:
        manifest = checkpoints.figures.get(case=wildcards.case, shown_target=target).output[0]
        files.append(manifest)
        try:
            names = json.loads(Path(manifest).read_text())["figures"]
            listed = [paths.figure(wildcards.case, target, name) for name in names]
        except (OSError, ValueError, TypeError, KeyError):
            continue
        files += [f for svg in listed for f in (svg, paths.sidecar(svg)) if os.path.exists(f)]
    return files
