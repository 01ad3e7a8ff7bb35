"""The same workflow under SLURM: a real single-node cluster, the SLURM profile, and a
local run of the same config to compare the site with.

The cluster's ``gpu`` partition holds a stand-in GPU (gres backed by /dev/null, node
feature ``standin``). This machine measures the ``cpu`` target, so the test's config asks
``cpu`` jobs for what a GPU target's jobs ask for (``gpus: 1``, ``constraint: standin``),
as a site maps ``h100`` to its H100 nodes, and checks where each job ran.

The tiny config runs upstream's variant alone (``CASE``): every rule still runs, and the
port's interpret-mode time job, a minute of work with nothing SLURM-specific in it, would
only hold the run (the executor's status checks back off while no job finishes).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from slurm_cluster import FEATURE, MARKER, SlurmCluster, Unavailable
from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file
from test_workflow import edited, make_project, snakemake, tiny_case

from casebook.core import paths
from tests.projects import finished_run, run_env

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.timeout(900)]

PROFILE = paths.SOURCE_ROOT / "workflow/profiles/slurm"
CASE = tiny_case(variants=("upstream",))
GPU_RULES = {"env", "host", "verify", "check_power", "noise_floor", "time", "ablate", "baseline",
             "compare"}
CPU_RULES = {"lower", "lower_build_only", "build", "figures", "page", "methods",
             "records", "static", "index", "site"}
MEASUREMENT_RULES = {"noise_floor", "time", "baseline", "compare"}
# What a verify record says about correctness, apart from its fresh draws and errors.
VERDICT = ("target", "case", "variant", "point", "params", "sources_sha256", "oracle",
           "tolerance", "trials", "ran", "races_found", "passed", "failures")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    slurm = SlurmCluster(tmp_path_factory.mktemp(MARKER))
    try:
        slurm.start()
    except Unavailable as why:
        slurm.stop()
        pytest.skip(f"this machine cannot run SLURM: {why}")
    except BaseException:
        slurm.stop()
        raise
    try:
        yield slurm
    finally:
        slurm.stop()
        assert not slurm.alive(), f"daemons still running: {slurm.alive()}"


def on_cluster(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``snakemake --profile workflow/profiles/slurm`` with this test cluster's site settings."""
    site = project.parent
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", str(project / PROFILE.relative_to(
            paths.SOURCE_ROOT)), "--configfile", str(site / "tiny.yaml"),
         str(site / "cluster.yaml"),
         "--slurm-partition-config", str(site / "partitions.yaml"),
         # No slurmdbd here: squeue sees jobs finish, sacct never would.
         "--slurm-status-command", "squeue", "--slurm-no-account",
         "--slurm-init-seconds-before-status-checks", "2", *args],
        cwd=project, capture_output=True, text=True, timeout=800, env=run_env())


def cluster_project(root: Path) -> Path:
    project = make_project(root, CASE)
    (root / "cluster.yaml").write_text(yaml.safe_dump({
        "targets": ["cpu"],
        "cluster": {"cpu": {"gpus": 1, "constraint": FEATURE},
                    "measure_cpus": os.cpu_count() or 1}}))
    (root / "partitions.yaml").write_text(yaml.safe_dump({"partitions": {
        "debug": {"max_gpu": 0},
        "gpu": {"max_gpu": 1, "available_constraints": [FEATURE]}}}))
    return project


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The same tiny config run locally and through SLURM: ``(local, remote, output)``.
    The local run goes on while the cluster's jobs wait for the one stand-in GPU and
    the executor's status checks (the SLURM run is mostly waiting)."""
    remote = cluster_project(tmp_path_factory.mktemp("remote"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        local_run = pool.submit(finished_run, tmp_path_factory, CASE)
        done = on_cluster(remote)
        local = local_run.result()
    assert done.returncode == 0, done.stderr[-6000:]
    return local, remote, done.stdout + done.stderr


def submitted(output: str) -> dict[str, str]:
    """SLURM job id -> its log, as the executor announced each submission."""
    return dict(re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)", output))


def rule_of(job: dict[str, str]) -> str:
    """The rule a job ran: the executor's comment is ``rule_<name>_wildcards_<...>``."""
    return re.match(r"rule_([a-z_]+?)(?:_wildcards_|$)", job["Comment"])[1]


def local_jobs(output: str) -> int:
    """Jobs a local run ran, from its job-stats table, without the target-only ``all``."""
    total = int(re.search(r"^total\s+(\d+)$", output, re.MULTILINE)[1])
    return total - 1


def test_every_job_went_through_slurm(runs, cluster):
    local, _, output = runs
    ids = submitted(output)
    done = snakemake(local, "--dry-run", "--forceall")
    assert len(ids) == local_jobs(done.stdout + done.stderr)
    jobs = {job["JobId"]: job for job in cluster.jobs()}
    assert set(ids) <= set(jobs)
    assert {jobs[i]["JobState"] for i in ids} == {"COMPLETED"}
    finished = {c["JobId"]: c for c in cluster.completions()}
    assert set(ids) <= set(finished), "every job is in the SLURM completion trace"
    assert {finished[i]["ExitCode"] for i in ids} == {"0:0"}
    # The upstream-only case has no ablation (each ablates the port).
    assert {rule_of(jobs[i]) for i in ids} == (GPU_RULES - {"ablate"}) | CPU_RULES


def test_gpu_rules_ran_in_the_gpu_partition_and_the_rest_elsewhere(runs, cluster):
    _, _, output = runs
    for job in (j for j in cluster.jobs() if j["JobId"] in submitted(output)):
        rule = rule_of(job)
        if rule in GPU_RULES:
            assert (job["Partition"], job["Features"]) == ("gpu", FEATURE), job
            assert "gres:gpu:1" in job.get("TresPerJob", ""), job
        else:
            assert job["Partition"] == "debug" and FEATURE not in job["Features"], job
            assert "gpu" not in job.get("TresPerJob", ""), job
        if rule in MEASUREMENT_RULES:
            assert job["OverSubscribe"] == "NO", f"a measurement owns its node: {job}"


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_the_site_is_the_local_runs_site(runs):
    local, remote, _ = runs
    assert files(local / "site/public") == files(remote / "site/public")
    assert files(local / paths.RESULTS) == files(remote / paths.RESULTS)
    records = sorted((local / paths.target_dir("cpu")).rglob("verify/**/*.json"))
    assert records
    for record in records:
        here = json.loads(record.read_text())
        there = json.loads((remote / record.relative_to(local)).read_text())
        assert here.keys() == there.keys()
        assert {k: here[k] for k in VERDICT} == {k: there[k] for k in VERDICT}
    for manifest in (local / paths.FIGURES).rglob("figures.json"):
        here = json.loads(manifest.read_text())
        there = json.loads((remote / manifest.relative_to(local)).read_text())
        assert (here["figures"], here["withheld"]) == (there["figures"], there["withheld"])


def test_a_failed_job_is_reported_with_its_slurm_id_and_log(runs):
    _, remote, _ = runs
    point = CASE["points"][0]["name"]
    record = remote / f"results/cpu/splash_attention/time/upstream/{point}.json"
    with edited(record, record.read_text()[:100]):
        done = on_cluster(remote, "--forcerun", "figures")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    (job_id, log), = submitted(output).items()
    assert f"SLURM-job '{job_id}' failed" in output
    assert log in output.split(f"SLURM-job '{job_id}' failed", 1)[1]
    assert "corrupt or truncated JSON" in (remote / log).read_text()


class Job:
    """What the executor's partition choice reads of a job."""

    def __init__(self, name: str, resources: dict):
        self.name, self.resources, self.threads = name, resources, 1


class Quiet:
    def debug(self, *_):
        pass

    info = warning = debug


def pairs(text: str) -> dict[str, str]:
    """``a=1, b=x`` as a dict."""
    return dict(p.split("=", 1) for p in text.split(", ")) if text else {}


def planned_jobs(output: str) -> list[tuple[str, dict, dict]]:
    """``(rule, wildcards, resources)`` of every job a dry run lists."""
    return [(rule, pairs(wildcards), pairs(resources)) for rule, wildcards, resources in
            re.findall(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: (.*)\n"
                       r"(?:    (?!resources).*\n)*?    resources: (.*)$", output, re.MULTILINE)]


def test_each_targets_jobs_ask_for_its_gpu_kind_and_reach_its_partition(tmp_path):
    """No SLURM needed: the plan of a three-target run, routed by the shipped partitions."""
    project = make_project(tmp_path, tiny_case())
    done = snakemake(project, "--dry-run", "--config", "targets=[cpu,h100,b200]")
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = planned_jobs(done.stdout)
    partitions = read_partition_file(PROFILE / "partitions.yaml")
    by_target: dict[str, set[str]] = {}
    for rule, wildcards, resources in jobs:
        target = wildcards.get("target") or wildcards.get("shown_target")
        partition = get_best_partition(partitions, Job(rule, {
            k: int(v) if v.isdigit() else v for k, v in resources.items()}), Quiet())
        if rule in GPU_RULES and target != "cpu":
            assert (resources["gpu"], resources["constraint"]) == ("1", target), rule
            assert partition == "gpu", (rule, target)
            by_target.setdefault(target, set()).add(rule)
        else:
            assert resources.get("gpu", "0") == "0" and "constraint" not in resources, rule
            assert partition == "cpu", (rule, target)
    assert by_target == {"h100": GPU_RULES, "b200": GPU_RULES}
