"""End to end: the whole DAG on a tiny config, in a copy of the sources in a temp dir."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import psutil
import pytest
import yaml

from casebook.core import fmt, jobprofile, paths
from casebook.core.stand_ins import is_stand_in
from casebook.hosts import archive
from casebook.report import conditions
from tests.projects import (
    finished_run,
    make_project,
    moved,
    run_env,
    session_root,
    snakemake,
    tiny_case,
    tiny_moe_case,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

class Figures(HTMLParser):
    """Collects, per <figure>, the <h4> headings of its conditions panel and its images."""

    def __init__(self):
        super().__init__()
        self.figures: list[dict] = []
        self._in_h4 = False

    def handle_starttag(self, tag, attrs):
        if tag == "figure":
            self.figures.append({"headings": [], "images": [], "items": 0})
        elif self.figures and tag == "h4":
            self._in_h4 = True
        elif self.figures and tag == "img":
            self.figures[-1]["images"].append(dict(attrs)["src"])
        elif self.figures and tag == "li":
            self.figures[-1]["items"] += 1

    def handle_endtag(self, tag):
        self._in_h4 = False if tag == "h4" else self._in_h4

    def handle_data(self, data):
        if self._in_h4:
            self.figures[-1]["headings"].append(data.strip())


def figures_of(page: Path) -> list[dict]:
    parser = Figures()
    parser.feed(page.read_text())
    return parser.figures


@contextlib.contextmanager
def edited(path: Path, text: str):
    """``path`` holds ``text`` inside the block; afterwards its content and time stamps."""
    before, stat = path.read_text(), path.stat()
    path.write_text(text)
    try:
        yield
    finally:
        path.write_text(before)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return finished_run(tmp_path_factory, tiny_case(), tiny_moe_case())


def test_fresh_run_publishes_every_figure_with_six_conditions(project):
    index = project / "site/public/index.html"
    page = project / "site/public/splash_attention.html"
    assert index.exists() and page.exists()
    assert "verified (interpreted kernel) in interpret mode on the host CPU" in \
        page.read_text()
    assert 'title="not measured on GPU">no GPU time</span>' in index.read_text()
    assert re.search(r'badge tone-ok"[^>]*>verified \d+/\d+<', index.read_text())
    # The check's power, from the point's check_power record: upstream's f16 tolerance
    # lets a 1% bias of out through, and the page and the index say so.
    power = json.loads((project / "results/cpu/splash_attention/check_power/"
                        "mha_causal_f16.json").read_text())
    rows = {r["name"]: r for r in power["mutants"] if r["output"] == "out"}
    assert rows["partial_block_as_full"]["caught"] and rows["last_kv_block_skipped"]["caught"]
    assert rows["next_key_seen"]["caught"]
    assert f"out:{'bias_1pct'}" in power["missed"]
    assert "check WEAK at 2 of 2 verified points: lets out:bias_1pct pass" in \
        html.unescape(page.read_text())
    assert 'title="lets out:bias_1pct pass">WEAK 2/2<' in html.unescape(index.read_text())
    # In the figures' correctness condition: the alarm once for the variants weak at the
    # same points, each point's line (folded) saying what it lets through.
    assert ("mgpu, upstream: check power WEAK at 1 of 1 verified points each "
            "(mha_causal_f16)") in html.unescape(page.read_text())
    assert ("check power weak: 3/4 mutants caught (as a check of poisoned outputs), lets "
            "out:bias_1pct pass") in html.unescape(page.read_text())
    figures = figures_of(page)
    assert len(figures) == 4  # correctness, build (shared memory), timing, ablations
    for figure in figures:
        assert figure["headings"] == list(conditions.HEADINGS.values())
        assert figure["items"] >= 6
        for src in figure["images"]:
            assert (page.parent / src).stat().st_size > 0
    assert "CPU interpret-mode time, not GPU time" in page.read_text()
    assert "Randomized check" in page.read_text()  # the fuzz record the case cites
    assert "lowered for cuda sm_90a" in page.read_text()
    assert "not GPU time" in (project / "results/figures/splash_attention/cpu/timing.svg"
                              ).read_text()
    # Where the time goes: mgpu beside each ablation, lowered and timed, never verified.
    ablated = json.loads((project / "results/figures/splash_attention/cpu/"
                          "ablation_mgpu.json").read_text())
    for name in ("mgpu_no_mask_evaluation", "mgpu_no_rescaling", "mgpu_one_compute_wg",
                 "mgpu_one_stage"):
        record = json.loads((project / "results/cpu/splash_attention/ablation" / name
                             / "mha_causal_f16.json").read_text())
        assert record["applies"] and record["timed"] and record["shared_host"], name
        assert f"{name}: " in ablated["caption"]
    assert "never verified" in ablated["caption"]
    assert "mgpu_no_mask_evaluation: " in ablated["caption"]
    assert "Where the time goes: mgpu" in page.read_text()


def test_the_moe_case_publishes_its_stages_verified_lowered_and_labelled(project):
    page = (project / "site/public/moe_nvfp4.html").read_text()
    # correctness, build, timing, and where moe_fused's time goes (its two ablations)
    assert len(figures_of(project / "site/public/moe_nvfp4.html")) == 4
    scales = json.loads((project / "results/cpu/moe_nvfp4/ablation/moe_fused_given_scales/"
                         "e2_m128_h256_i256.json").read_text())
    assert scales["timed"] and not scales["against_oracle"]["within_tolerance"]
    results = project / "results/cpu/moe_nvfp4"
    for path in (results / "verify").rglob("*.json"):
        record = json.loads(path.read_text())
        if path.parent.name == "gemm1_sm100a_n128k256s3":  # Blackwell: lowered only
            assert not record["ran"] and not record["passed"], path
            assert record["not_run_reason"].startswith("lowered only, never run")
            continue
        assert record["passed"] and record["ran"] and not record["races_found"], path
        outputs = record["checks"][0]["outputs"]
        assert set(outputs) <= {"a1", "a2", "h", "out_fused"}, outputs
    blackwell = json.loads((results / "build/gemm1_sm100a_n128k256s3.json").read_text())
    for point in blackwell["points"]:
        (artifact,) = point["artifacts"]
        assert artifact["target"] == "cuda sm_100a"
        assert artifact["facts"]["tmem_columns"] == 256, point["point"]
    assert "256 of 512 columns" in page and "kind::mxf4nvf4.block_scale" in page
    build = json.loads((results / "build/moe_fused.json").read_text())
    assert [p["point"] for p in build["points"]] == ["e2_m128_h256_i256", "g4_m256"]
    kinds = [a["kind"] for a in build["points"][1]["artifacts"]]
    assert [k.split(": ")[1].split(" ")[0] for k in kinds] == ["quantize", "fused", "gemm2"]
    # FlashInfer's kernel source, from env/reference.lock, hashed (never imported).
    source = build["reference_source"]
    assert source["file"].endswith("flashinfer/gemm/kernels/grouped_gemm_masked_blackwell.py")
    assert f"sha256 {source['sha256'][:16]}…" in page
    assert "CPU interpret-mode time or CPU XLA time, not GPU time" in page
    # No B200 has run the case: its target's row says which variants wait for one.
    never = ("gemm1_sm100a_n128k256s3 lowered for sm_100a on cpu, never run on a B200: "
             "no record")
    assert 'id="target-b200"' in page and never in page
    assert never in (project / "site/public/index.html").read_text()


def test_every_measured_figure_shows_how_it_was_measured(project):
    """Median, interval, sample count, stopping reason, clock and noise floor, each from
    the records, on the page and in every figure's conditions."""
    floor = json.loads((project / "results/cpu/noise_floor.json").read_text())
    page = (project / "site/public/splash_attention.html").read_text()
    records = [json.loads(p.read_text()) for p in
               (project / "results/cpu/splash_attention").glob("*/*/*.json")
               if p.parent.parent.name in ("time", "baseline")]
    measured = [r["measurement"] for r in records if r["timed"]]
    # Interpret-mode kernels get the short protocol (measurement.interpret), XLA not.
    assert {(r["execution"]["interpret"], r["measurement"]["stop_criterion"])
            for r in records if r["timed"]} == {(True, "fixed_count"),
                                                (False, "median_precision")}
    # Two kernels and two baselines at one point; upstream attention_mgpu (sm_90 only)
    # and cuDNN attention (NVIDIA GPUs only) are recorded as not run here, each with its
    # reason, on the page too.
    assert len(measured) == 4 and len(records) == 6
    # Every interval holds where a rerun lands (the host's floor, the repeats); XLA runs
    # pinned to one CPU, the interpreter (no speed result, a thread per warpgroup) not.
    assert floor["pinned_cpu"] is not None and floor["repeats"] == 5
    for r in (r for r in records if r["timed"]):
        m, interpreted = r["measurement"], r["execution"]["interpret"]
        assert interpreted == is_stand_in(r["execution"])
        assert m["interval"] == "run-to-run" and m["floor_applied"] == floor["noise_floor"]
        assert m["ci_low_s"] <= m["median_s"] / (1 + floor["noise_floor"])
        assert m["repeats"] == (1 if interpreted else 5)
        # A host stand-in is measured hot (measurement.interpret.cache), XLA as the case
        # says (cold).
        assert m["cache"]["mode"] == ("hot" if interpreted else "cold")
        assert (m["pinned_cpu"] is None) == interpreted
        # The interpreter's host time is no speed result: one core, beside other jobs
        # (the run has two); a speed result (time records only) the whole machine.
        assert r.get("shared_host", False) == (interpreted and "variant" in r)
    assert any(r.get("shared_host") for r in records)
    assert "timed on one core beside other jobs" in page
    # A time job that measures nothing (its kernel not run here: case 01's sm_100a GEMM)
    # or a host stand-in took one core of the run's two; a speed result would take both.
    timed = sorted((project / "results/cpu").glob("*/time/*/*.json"))
    assert any(not json.loads(p.read_text())["timed"] for p in timed)
    for path in timed:
        r = json.loads(path.read_text())
        log = project / paths.log("time", "cpu", path.parents[2].name, path.parent.name,
                                  path.stem)
        one_core = not r["timed"] or is_stand_in(r["execution"])
        assert jobprofile.read(log)["threads"] == (1 if one_core else 2), path
    not_run = [r for r in records if not r["timed"]]
    assert {r["baseline"] for r in not_run} == {"attention_mgpu", "cudnn_dot_product_attention"}
    for record in not_run:
        assert "not run here" in record["not_timed_reason"]
        assert html.escape(record["not_timed_reason"], quote=False) in page
    floor_text = f"±{floor['noise_floor']:.1%}"
    assert floor_text in page
    for m in measured:
        for shown in (fmt.seconds(m["median_s"]), fmt.seconds(m["ci_low_s"]),
                      fmt.seconds(m["ci_high_s"]), m["stop_reason"], m["clock_kind"],
                      m["cache"]["description"]):
            assert html.escape(str(shown), quote=False) in page, shown
        assert f"n={m['samples']}" in page
        samples = (project / m["samples_file"]).read_text().splitlines()
        assert len(samples) == 1 + m["samples"] + m["throttling"]["discarded"]
    sidecar = json.loads(
        (project / "results/figures/splash_attention/cpu/timing.json").read_text())
    assert any(floor_text in line for line in sidecar["conditions"]["measurement"])
    assert any(floor_text in line for line in sidecar["conditions"]["baseline"])
    verdicts = [line for line in sidecar["conditions"]["baseline"] if " against " in line]
    assert len(verdicts) == 4  # each kernel against each baseline
    # Interpreted kernels against XLA on the host: no kind of speed in common, so the
    # compare stage measured nothing and each pair says why, on the page too.
    compared = json.loads(
        (project / "results/cpu/splash_attention/compare/mha_causal_f16.json").read_text())
    assert not compared["measured"] and len(compared["pairs"]) == 4
    assert compared["paired_floor"] == floor["paired"]["noise_floor"]
    for line, pair in zip(verdicts, compared["pairs"], strict=True):
        assert line.endswith(pair["why_not"]) and "×" not in line
        assert " ran as interpreted kernel, " in line and " as XLA on the host CPU" in line
        assert html.escape(pair["why_not"], quote=False) in page


def test_the_run_printed_its_progress_per_stage(project):
    """The logger plugin of the default profile: a line per finished job, the last one
    with every stage done, as many jobs as Snakemake finished."""
    err = (project.parent / "snakemake.stderr").read_text()
    lines = re.findall(r"^casebook: (\d+)/(\d+) jobs · (.*)$", err, re.MULTILINE)
    finished = len(re.findall(r"^Finished jobid: ", err, re.MULTILINE))
    assert len(lines) >= finished > 0
    done, total, stages = lines[-1]
    assert int(done) == int(total) == finished
    counts = dict(re.fullmatch(r"(\w+) (\d+/\d+)", s).groups() for s in stages.split(" · "))
    assert {"lower", "verify", "time", "baseline", "figures", "page", "site"} <= counts.keys()
    assert all(a == b for a, b in (c.split("/") for c in counts.values()))


def test_every_published_file_comes_from_one_declared_part(project):
    """The site is the parts the site rule declares as its inputs (each a folder output
    of its own rule), merged: nothing else, and no file from two parts."""
    done = snakemake(project, "--dry-run", "--forcerun", "site", "--", "site/public")
    assert done.returncode == 0, done.stderr[-3000:]
    block = re.search(r"^(?:local)?rule site:\n(.*?)^\S", done.stdout + done.stderr,
                      re.MULTILINE | re.DOTALL)[1]
    parts = re.search(r"^    input: (.*)$", block, re.MULTILINE)[1].split(", ")
    assert {"build/site/index", "build/site/records"} <= set(parts)

    def files(root: Path) -> list[str]:
        return [p.relative_to(root).as_posix() for p in root.rglob("*")
                if p.is_file() and p.name != ".snakemake_timestamp"]

    made = [f for part in parts for f in files(project / part)]
    assert len(made) == len(set(made)), "a file comes from two parts"
    assert sorted(made) == sorted(files(project / "site/public"))
    assert "data/cpu/env.json" in made  # the records part's, linked by every page
    assert any(f.startswith("data/cpu/splash_attention/verify/") for f in made)


def test_second_run_does_nothing(project):
    done = snakemake(project, "--dry-run")
    assert done.returncode == 0
    assert "Nothing to be done" in done.stdout + done.stderr


def test_editing_a_kernel_reruns_only_that_case_and_says_why(project):
    kernel = project / "kernels/splash_attention/masks.py"
    with edited(kernel, kernel.read_text() + "\n# an edit\n"):
        done = snakemake(project, "--dry-run")
    out = done.stdout + done.stderr
    rules = set(re.findall(r"^(?:rule|checkpoint) (\w+):", out, re.MULTILINE))
    assert {"lower", "build", "verify", "time", "baseline", "figures", "page"} <= rules
    assert not rules & {"env", "host"}
    assert "Updated input files: " in out and "masks.py" in out


def test_the_case_target_runs_one_case(project):
    done = snakemake(project, "--dry-run", "splash_attention")
    assert done.returncode == 0


def dry_run_jobs(project: Path) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run lists."""
    done = snakemake(project, "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = []
    for block in re.split(r"^(?=(?:local)?(?:rule|checkpoint) \w+:$)", done.stdout + done.stderr,
                          flags=re.MULTILINE):
        if rule := re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block):
            wildcards = re.search(r"^    wildcards: (.*)$", block, re.MULTILINE)
            jobs.append((rule[1], wildcards[1] if wildcards else ""))
    return jobs


def test_a_module_the_case_never_imports_reruns_nothing(project):
    """Case 03's kernel and the shared interpreter: only the cases importing a file rerun."""
    other = project / "kernels/grouped_gemm_fp8_bf16/port.py"
    with edited(other, other.read_text() + "\n# an edit\n"):
        os.utime(other)
        assert dry_run_jobs(project) == []
    shared = project / "kernels/mgpu_interpret.py"
    with edited(shared, shared.read_text() + "\n# an edit\n"):
        os.utime(shared)
        jobs = dry_run_jobs(project)
    assert {re.search(r"case=(\w+)", w)[1] for r, w in jobs if r == "verify"} == {
        "splash_attention", "moe_nvfp4"}


def test_editing_one_point_reruns_that_points_jobs_only(project):
    case_file = project.parent / "cases/splash_attention.yaml"
    case = yaml.safe_load(case_file.read_text())
    (point,) = case["points"]
    measured = {"verify", "time", "baseline", "check_power", "compare"}
    # A second point: its own jobs run, and each variant's build record gathers it.
    added = {**point, "name": "second", "params": {**point["params"], "seq_len": 256}}
    with edited(case_file, yaml.safe_dump({**case, "points": [point, added]})):
        os.utime(case_file)
        jobs = dry_run_jobs(project)
    assert {r for r, _ in jobs} >= measured | {"lower", "build"}
    assert not [w for r, w in jobs if r == "lower" and "point=second" not in w]
    assert not [w for r, w in jobs if r in measured and "point=second" not in w]
    assert "lower_build_only" not in {r for r, _ in jobs}
    # A build-only point: its variants' build-only lowerings (one job each) and builds.
    (only,) = case["build_only_points"]
    bigger = {**only, "params": {**only["params"], "seq_len": 2 * only["params"]["seq_len"]}}
    with edited(case_file, yaml.safe_dump({**case, "build_only_points": [bigger]})):
        os.utime(case_file)
        jobs = dry_run_jobs(project)
    rules = {r for r, _ in jobs}
    assert {"lower_build_only", "build"} <= rules and not rules & (measured | {"lower"})
    assert len([r for r, _ in jobs if r == "lower_build_only"]) == len(case["variants"])
    # The page's words alone: no measurement, no build reruns.
    with edited(case_file, yaml.safe_dump({**case, "title": "Another title"})):
        os.utime(case_file)
        jobs = dry_run_jobs(project)
    assert {r for r, _ in jobs} == {"figures", "page", "methods", "index", "site", "all"}


@contextlib.contextmanager
def moved_away(path: Path):
    """``path`` is gone inside the block; afterwards it is back, time stamps included."""
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    try:
        yield
    finally:
        aside.rename(path)


@pytest.mark.parametrize(("kept", "rule"), [
    ("results/cpu/noise_floor.json", "noise_floor"),
    ("results/cpu/splash_attention/build/mgpu/mha_causal_f16.json", "lower"),
    ("results/cpu/splash_attention/check_power/mha_causal_f16.json", "check_power"),
    ("results/cpu/moe_nvfp4/time/moe_fused/e2_m128_h256_i256.samples.csv", "time"),
    ("results/cpu/splash_attention/compare/mha_causal_f16.samples.csv", "compare"),
    ("results/figures/splash_attention/cpu/figures.json", "figures"),
    ("build/site/pages/moe_nvfp4.json", "page"),
])
def test_a_missing_file_the_run_keeps_is_made_again(project, kept, rule):
    """Every file a run keeps is a target: one gone (a killed job's output is deleted)
    is made again although everything after it is current."""
    assert dry_run_jobs(project) == []
    with moved_away(project / kept):
        jobs = dry_run_jobs(project)
    assert rule in {r for r, _ in jobs}


def script_jobs(run: int, script: str) -> list[psutil.Process]:
    """The jobs of Snakemake process ``run`` running its copy of ``script``: a child only
    forked by the run still has the run's command line, which may name the script's
    outputs too."""
    jobs = []
    for child in psutil.Process(run).children():
        with contextlib.suppress(psutil.Error):  # a short-lived child may be gone
            if any(part.endswith(f".{script}.py") for part in child.cmdline()):
                jobs.append(child)
    return jobs


@pytest.mark.timeout(600)
def test_a_killed_run_stops_its_jobs_and_resumes_with_one_command(project):
    """Killed as its only job starts: the job ends without writing, the next run names
    --unlock, and the one command of docs/recovery.md remakes the record (deleted by the
    killed run, its downstream current) and everything after it."""
    record = "results/cpu/splash_attention/check_power/mha_causal_f16.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile",
         str(project.parent / "tiny.yaml"), "--forcerun", record, "--", record],
        cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=run_env())
    jobs = []
    while not jobs and run.poll() is None:
        time.sleep(0.05)
        jobs = script_jobs(run.pid, "check_power")
    assert jobs, "the job never started"
    run.kill()
    run.wait()
    try:
        _, alive = psutil.wait_procs(jobs, timeout=15)
        assert not alive, "a job outlived its killed run"
        assert not (project / record).exists(), "the killed run's job wrote its record"
        locked = snakemake(project)  # the killed run's lock stays
        assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
        # docs/recovery.md: the one command that resumes.
        resumed = subprocess.run(
            ["sh", "-c", f"{sys.executable} -m snakemake --unlock --configfile ../tiny.yaml "
             f"&& {sys.executable} -m snakemake --cores 2 --rerun-incomplete "
             f"--configfile ../tiny.yaml"], cwd=project, capture_output=True, text=True,
            env=run_env())
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert json.loads((project / record).read_text())["kind"] == "check_power"
        assert re.search(r"^localrule site:", resumed.stdout + resumed.stderr, re.M)
        assert dry_run_jobs(project) == []
    finally:  # the later tests of this project need it whole, whatever happened here
        snakemake(project, "--unlock")
        restored = snakemake(project)
        assert restored.returncode == 0, restored.stderr[-3000:]


def test_a_moved_checkout_reruns_nothing(project, tmp_path, tmp_path_factory):
    """Nothing a rule reads, nor any record, names the folder the project sits in (the
    run was made in another folder of this session, then copied: see finished_run)."""
    elsewhere = moved(project, tmp_path / "elsewhere")
    assert dry_run_jobs(elsewhere) == []
    sat_in = str(session_root(tmp_path_factory))
    named = [p for p in (elsewhere / "results").rglob("*")
             if p.is_file() and sat_in in p.read_text(errors="replace")]
    assert not named


class Links(HTMLParser):
    """Every local href and src of a page."""

    def __init__(self):
        super().__init__()
        self.links: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value and not re.match(r"[a-z]+:", value):
                self.links.add(value.split("#")[0])


def dead_links(site: Path) -> list[str]:
    """Links of every published page to a file that is not in the site."""
    dead = []
    for page in site.glob("*.html"):
        parser = Links()
        parser.feed(page.read_text())
        dead += [f"{page.name} -> {link}" for link in parser.links
                 if link and not (site / link).is_file()]
    return dead


@pytest.mark.parametrize("broken", ["sidecar", "manifest"])
def test_a_broken_sidecar_or_manifest_fails_the_page_never_the_site(project, broken):
    """A hand-edited sidecar missing a condition, or a truncated manifest, is an input:
    the next run renders the page as failed with the error, the index says so, no link
    dies, and the run exits 1 naming it."""
    figures = project / "results/figures/splash_attention/cpu"
    sidecar, manifest = figures / "timing.json", figures / "figures.json"
    if broken == "sidecar":
        data = json.loads(sidecar.read_text())
        del data["conditions"]["baseline"]
        path, text, error = sidecar, json.dumps(data), "conditions.baseline"
    else:
        path, text, error = manifest, manifest.read_text()[:80], "corrupt or truncated JSON"
    with edited(path, text):
        os.utime(path)  # edited now
        done = snakemake(project)
    assert done.returncode == 1, done.stderr[-3000:]
    where = f"{path.relative_to(project)}: {error}"
    assert re.search(rf"^casebook: .*page\(s\) failed to render: splash_attention "
                     rf"\({re.escape(where)}", done.stderr, re.MULTILINE), done.stderr[-3000:]
    site = project / "site/public"
    page = (site / "splash_attention.html").read_text()
    assert "could not be rendered" in page and html.escape(where) in page
    index = (site / "index.html").read_text()
    assert "FAILED to render" in index and html.escape(where) in index
    assert "moe_nvfp4.html" in index and figures_of(site / "moe_nvfp4.html")
    assert not dead_links(site)
    restored = snakemake(project, "--forcerun", "page", "splash_attention")
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert len(figures_of(site / "splash_attention.html")) == 4 and not dead_links(site)


def test_a_hand_edited_sidecar_reruns_its_page(project):
    sidecar = project / "results/figures/splash_attention/cpu/build.json"
    data = json.loads(sidecar.read_text())
    data["caption"] += " (edited)"
    with edited(sidecar, json.dumps(data)):
        os.utime(sidecar)
        done = snakemake(project, "--dry-run")
    out = done.stdout + done.stderr
    assert set(re.findall(r"^rule (\w+):", out, re.MULTILINE)) == {
        "page", "index", "site", "all"}, out[-3000:]
    assert f"Updated input files: {sidecar.relative_to(project)}" in out


def test_a_corrupt_record_stops_the_figures(project):
    record = project / "results/cpu/splash_attention/time/upstream/mha_causal_f16.json"
    with edited(record, record.read_text()[:100]):
        done = snakemake(project, "--forcerun", "figures", "splash_attention")
    assert done.returncode != 0
    assert f"{record.relative_to(project)}: corrupt or truncated JSON" in done.stderr
    assert f"to make it again: rm {record.relative_to(project)} && snakemake --cores all" \
        in done.stderr
    # The compare job, which reads the record too, failed and its outputs are gone: the
    # later tests of this project need it whole.
    restored = snakemake(project)
    assert restored.returncode == 0, restored.stderr[-3000:]


def test_a_failed_verification_is_shown_never_timed(tmp_path_factory):
    # A copy of the shared run, its splash tolerances made a billion times tighter: the
    # run verifies both variants again (and checks the baselines again), and they fail.
    project = finished_run(tmp_path_factory, tiny_case(), tiny_moe_case())
    case_file = project.parent / "cases/splash_attention.yaml"
    case_file.write_text(yaml.safe_dump(tiny_case(tolerance_scale=1e-9)))
    done = snakemake(project)
    # The site is rendered, then the run fails, naming the points in one line.
    assert done.returncode == 1, done.stderr[-4000:]
    line = ("casebook: 2 point(s) failed verification: cpu/splash_attention/mgpu/"
            "mha_causal_f16, cpu/splash_attention/upstream/mha_causal_f16 (the site shows them)")
    assert line in done.stderr.splitlines()
    # A rerun with nothing to do says nothing; the verdict on the records says it again.
    again = subprocess.run([sys.executable, "-m", "casebook.report.verdict", "--configfile",
                            str(project.parent / "tiny.yaml")], cwd=project,
                           capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(project)})
    assert again.returncode == 1 and again.stderr.splitlines() == [line], again.stderr
    quiet = snakemake(project, "--config", "fail_on_failures=False", "--forcerun", "index")
    assert quiet.returncode == 0 and line in quiet.stderr.splitlines(), quiet.stderr[-2000:]
    time_record = json.loads(
        (project / "results/cpu/splash_attention/time/upstream/mha_causal_f16.json").read_text())
    assert time_record["timed"] is False
    assert time_record["not_timed_reason"].startswith("verification failed")
    manifest = json.loads(
        (project / "results/figures/splash_attention/cpu/figures.json").read_text())
    assert manifest["figures"] == ["correctness", "build"]
    assert manifest["withheld"][0]["figure"] == "timing"
    page = (project / "site/public/splash_attention.html").read_text()
    assert '<div class="failure" role="alert">' in page and "withheld" in page
    assert re.search(r'<td class="[^"]*\bfail\b[^"]*" >FAILED</td>', page)
    assert "verification FAILED" in page
    assert re.search(r'badge tone-bad"[^>]*>FAILED \d+<',
                     (project / "site/public/index.html").read_text())


def as_other_target(project: Path, target: str, gpu: str) -> None:
    """Turn this run's CPU records into records as a GPU host of ``target`` would commit."""
    source, dest = project / "results/cpu", project / f"results/{target}"
    shutil.copytree(source, dest)
    for path in dest.rglob("*.json"):
        data = json.loads(path.read_text())
        data["target"] = target
        if path.name == "host.json":
            data["device_class"] = target
            data["gpus"] = [{"name": gpu, "compute_capability": "9.0",
                             "memory_bytes": 141 * 2**30, "driver_version": "580.159.03",
                             "cuda_driver_version": "13.0"}]
        path.write_text(json.dumps(data))


def test_other_targets_are_rendered_beside_never_regenerated(project):
    as_other_target(project, "h200", "NVIDIA H200")
    jobs = dry_run_jobs(project)
    assert ("figures", "case=splash_attention, shown_target=h200") in jobs
    assert not [j for j in jobs if "target=h200" in j[1] and j[0] != "figures"]
    done = snakemake(project)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (project / "site/public/splash_attention.html").read_text()
    assert 'id="target-cpu"' in page and 'id="target-h200"' in page
    assert "GPU: NVIDIA H200" in page
    assert len(figures_of(project / "site/public/splash_attention.html")) == 8
    assert len(list((project / "results/h200").rglob("*.json"))) == len(
        list((project / "results/cpu").rglob("*.json")))


def test_an_imported_partial_gpu_window_is_rendered_beside_cpu(project, tmp_path,
                                                                 monkeypatch):
    """A GPU window stopped part-way: packed there, imported here, shown beside cpu."""
    made = tmp_path / "host"
    shutil.copytree(project / "results/cpu", made / "results/h200")
    head = subprocess.run(["git", "-C", str(paths.SOURCE_ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for path in (made / "results/h200").rglob("*.json"):
        data = {**json.loads(path.read_text()), "target": "h200", "commit": head}
        if path.name == "host.json":
            data["device_class"] = "h200"
            data["gpus"] = [{"name": "NVIDIA H200", "compute_capability": "9.0",
                             "memory_bytes": 141 * 2**30, "driver_version": "580.159.03",
                             "cuda_driver_version": "13.0"}]
        path.write_text(json.dumps(data))
    stopped = made / "results/h200/moe_nvfp4/time"  # the window ran out during case 01
    shutil.rmtree(stopped)
    monkeypatch.chdir(made)
    packed = archive.pack("h200", tmp_path / "out", 16 * 2**20)
    done = archive.import_archive(Path(packed["file"]), root=project)
    assert done["target"] == "h200" and done["commits"] == [head]
    assert not (project / "results/h200/moe_nvfp4/time").exists()
    run = snakemake(project)
    assert run.returncode == 0, run.stderr[-3000:]
    for case in ("splash_attention", "moe_nvfp4"):
        page = (project / f"site/public/{case}.html").read_text()
        assert 'id="target-cpu"' in page and 'id="target-h200"' in page
        assert "GPU: NVIDIA H200" in page
    regenerated = [j for j in re.findall(r"wildcards: (.*)", run.stdout + run.stderr)
                   if re.search(r"\btarget=h200", j)]
    assert not regenerated and "shown_target=h200" in run.stdout + run.stderr


def test_bad_config_on_the_command_line_names_the_key(project):
    done = snakemake(project, "--dry-run", "--config", "colour=red")
    assert done.returncode != 0
    assert "casebook: error: --config: colour: unknown key" in done.stderr.splitlines()
    done = snakemake(project, "--dry-run", "--config", "cases=[nosuch]")
    assert done.returncode != 0
    assert "nosuch.yaml: unknown case 'nosuch'" in done.stdout + done.stderr


def test_an_over_budget_configuration_fails_the_build_naming_it(tmp_path):
    case = tiny_case()
    case["build_only_points"] = [{"name": "too_big", "params": {
        "heads_q": 1, "heads_kv": 1, "seq_len": 4096, "head_dim": 256,
        "mask": {"kind": "causal"}, "dtype": "bfloat16",
        "tiles": {"block_q": 128, "block_kv": 256, "stages": 4}}}]
    project = make_project(tmp_path, case)
    done = snakemake(project)
    assert done.returncode != 0
    assert "too_big" in done.stderr and "232448-byte limit" in done.stderr
