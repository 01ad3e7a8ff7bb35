"""All records of one case on one target, read through the schema, in one object."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from casebook.core import paths, provenance, records
from casebook.measure.clocks import times_on_host
from casebook.stages import check_power, tile_table


def subject(execution: dict[str, Any], gpus: list[Any]) -> str:
    """What ran, named: the execution's own ``subject`` (e.g. a numerics model), else an
    interpreted kernel, a program on the TPU, a kernel on the GPU, or XLA on the host
    CPU."""
    if execution.get("subject"):
        return execution["subject"]
    if execution["interpret"]:
        return "interpreted kernel"
    if execution.get("device") == "tpu":
        return "TPU kernel"
    return "GPU kernel" if gpus else "XLA on the host CPU"


# The start of a record's ``not_timed_reason`` where the work ran out of the device's
# memory (written by ``timing``, drawn by ``figures``).
DOES_NOT_FIT = "does not fit in the device's memory"


def honest_clock(record: dict[str, Any]) -> dict[str, Any]:
    """A time or baseline record as shown: one whose work ran on the host
    (``times_on_host``) but was timed by a device clock counted only the device
    launches it made (or none), so it is shown as not timed, saying why. Records made since
    the engine gave host work the host clock are never of this kind."""
    measured = record.get("measurement")
    if not record.get("timed") or not times_on_host(record["execution"]) \
            or measured["clock_kind"] == "host":
        return record
    return {**{k: v for k, v in record.items() if k != "measurement"}, "timed": False,
            "not_timed_reason": f"{records.REFUSED}: timed by the {measured['clock_kind']} "
            "clock though its work ran on the host: that clock counted only the device "
            "launches it made"}


@dataclasses.dataclass
class Evidence:
    case: str
    target: str
    spec: dict[str, Any]
    env: dict[str, Any]
    host: dict[str, Any]
    builds: dict[str, dict[str, Any]]  # variant -> build record
    verify: dict[tuple[str, str], dict[str, Any]]  # (variant, point) -> record
    time: dict[tuple[str, str], dict[str, Any]]  # (variant, point) -> record
    baselines: dict[tuple[str, str], dict[str, Any]]  # (baseline, point) -> record
    noise_floor: dict[str, Any] | None  # the host's A/A record; None: none recorded
    sources: list[str]  # every record file read
    kernel_sources_sha256: str  # the case's kernel sources as they are now
    # The case's randomized_check records (benchmarks), with the config entry citing each.
    randomized: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # (variant, point) -> the autotune's tile_choice record, where a GPU run made one.
    tile_choices: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(
        default_factory=dict)
    # point -> the check_power record: verify's check run on near-miss mutants.
    check_power: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # (ablation, point) -> the ablation record: a variant with one part switched off.
    ablations: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    # point -> the compare record: its variants and baselines measured interleaved.
    compare: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # (variant, point) of a verification, (variant, None) of a build, (None, point) of a
    # check_power record -> the hash its record would carry if made now
    # (provenance.job_sha256).
    current_sha256: dict[tuple[str, str | None], str] = dataclasses.field(
        default_factory=dict)
    # (variant, point) of the verify and time records made with another tile choice than
    # the point's tile_choice record gives now (tile_table.cites_current).
    retuned: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def points(self) -> list[str]:
        return [p["name"] for p in self.spec["points"]]

    @property
    def variants(self) -> list[str]:
        return [v["name"] for v in self.spec["variants"]]

    @property
    def ran(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The verify records whose kernel executed on this host."""
        return {key: r for key, r in self.verify.items() if r["ran"]}

    @property
    def not_run(self) -> dict[str, str]:
        """Variant -> why it could not execute on this host."""
        return {v: r["not_run_reason"] for (v, _), r in self.verify.items() if not r["ran"]}

    @property
    def verified(self) -> bool:
        """Every kernel that executed here passed, and at least one did."""
        return bool(self.ran) and all(r["passed"] for r in self.ran.values())

    @property
    def stale(self) -> bool:
        """Whether a build, verification or check-power record was made from other kernel
        sources, or another slice of the case config, than the current ones, a
        verification or time with another tile-table row, or a comparison before what it
        pairs (``compare_stale``)."""
        made = {**{(v, None): r for v, r in self.builds.items()}, **self.verify,
                **{(None, p): r for p, r in self.check_power.items()}}
        return bool(self.retuned) or any(
            made[key]["sources_sha256"] != want
            for key, want in self.current_sha256.items() if key in made) or any(
            self.compare_stale(point) for point in self.compare)

    def power_stale(self, point: str) -> bool:
        """Whether ``point``'s check_power record was made from other kernel sources or
        another slice of the case config than the current ones."""
        record, want = self.check_power.get(point), self.current_sha256.get((None, point))
        return record is not None and want is not None and record["sources_sha256"] != want

    def compare_stale(self, point: str) -> bool:
        """Whether ``point``'s compare record is older than a verify, time or baseline
        record of a kernel or baseline it pairs: the workflow remakes a comparison after
        each of them, so an older one measured what those records replaced (an archive's
        import keeps it where a window stopped before remaking it)."""
        record = self.compare.get(point)
        if record is None or "created_at" not in record:
            return False
        paired = [p for p in record["pairs"] if "why_not" not in p]
        inputs = [r for p in paired for r in (self.verify.get((p["variant"], point)),
                                              self.time.get((p["variant"], point)),
                                              self.baselines.get((p["baseline"], point)))
                  if r is not None and "created_at" in r]
        return any(r["created_at"] > record["created_at"] for r in inputs)

    def comparison_stale(self, variant: str, point: str) -> bool:
        """Whether a verdict of ``variant`` at ``point`` is stale: its kernel's records
        (``stale_at``) or the comparison itself (``compare_stale``)."""
        return self.stale_at(variant, point) or self.compare_stale(point)

    def stale_at(self, variant: str, point: str) -> bool:
        """``stale`` for what a figure of ``variant`` at ``point`` shows: its build or its
        verification made from other sources or another config slice, or its verification
        or time with another tile-table row."""
        made = {(variant, None): self.builds.get(variant),
                (variant, point): self.verify.get((variant, point))}
        return (variant, point) in self.retuned or any(
            record is not None and key in self.current_sha256
            and record["sources_sha256"] != self.current_sha256[key]
            for key, record in made.items())

    def power(self, variant: str, point: str) -> dict[str, Any] | None:
        """The check's power for what ``variant`` computes at ``point`` (the outputs its
        verification checked); None where no check_power record or no check exists."""
        record, checked = self.check_power.get(point), self.verify.get((variant, point))
        checks = (checked or {}).get("checks", [])
        outputs = frozenset(name for c in checks for name in c.get("outputs", {}))
        # Every trial must pass, so a mutant that one poisoned run catches is caught.
        poisoned = any(c.get("execution", {}).get("poisoned") for c in checks)
        return check_power.power(record, outputs, poisoned) if record and outputs else None

    @property
    def weak(self) -> dict[tuple[str, str], str]:
        """(variant, point) -> why its check is weak, for the checks that ran: the mutants
        it lets through, a correct output it fails, or no power measured."""
        found = {}
        for variant, point in self.ran:
            power = self.power(variant, point)
            if power is None:
                found[variant, point] = "its power not measured"
            elif power["weak"]:
                found[variant, point] = power["why"]
        return found

    def subjects(self, records: list[dict[str, Any]]) -> list[str]:
        """What ran in ``records`` (verify checks or time records), named."""
        executions = [c["execution"] for r in records for c in r.get("checks", [r])
                      if "execution" in c]
        return sorted({subject(e, self.host["gpus"]) for e in executions})

    @property
    def interpreted_timed(self) -> list[str]:
        """The variants timed here in interpret mode (a host time, no GPU time)."""
        return sorted({v for (v, _), r in self.time.items()
                       if r["timed"] and r["execution"]["interpret"]})

    @property
    def interpreted(self) -> bool:
        """Whether every kernel timed here ran in the interpreter (and one was)."""
        timed = {v for (v, _), r in self.time.items() if r["timed"]}
        return bool(timed) and timed == set(self.interpreted_timed)


def gather(spec: dict[str, Any], target: str, must_exist: bool) -> Evidence:
    """Read every record of ``spec``'s grid on ``target``.

    ``must_exist`` (this machine's target) makes a missing record an error; records of
    other targets are taken as found.
    """
    spec, case = paths.for_target(spec, target), spec["name"]
    sources: list[str] = []

    def read(path: str, kind: str) -> dict[str, Any] | None:
        if not must_exist and not Path(path).exists():
            return None
        sources.append(path)
        return records.read(path, kind)

    def grid(names: list[str], path_of, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        found = {}
        for name in names:
            for point in spec["points"]:
                record = read(path_of(target, case, name, point["name"]), kind)
                if record is not None:
                    found[name, point["name"]] = record
        return found

    variants = [v["name"] for v in spec["variants"]]
    env_path, host_path = paths.env_record(target), paths.host_record(target)
    sources += [env_path, host_path]
    env, host = records.read(env_path, "env"), records.read(host_path, "host")
    builds = {v: read(paths.build_record(target, case, v), "build") for v in variants}
    randomized = []
    for check in spec.get("randomized_checks", []):
        sources.append(check["record"])  # relative to the sources, as the config says
        randomized.append({**check, **records.read(paths.SOURCE_ROOT / check["record"],
                                                   "randomized_check")})
    verified = grid(variants, paths.verify_record, "verify")
    timed = {k: honest_clock(r) for k, r in grid(variants, paths.time_record, "time").items()}
    return Evidence(
        case=case, target=target, spec=spec, env=env, host=host,
        builds={v: b for v, b in builds.items() if b is not None},
        verify=verified, time=timed,
        retuned=sorted({key for made in (verified, timed) for key, r in made.items()
                        if not tile_table.cites_current(r, target, case, key[0])}),
        baselines={k: honest_clock(r) for k, r in grid(
            [b["name"] for b in spec["baselines"]], paths.baseline_record, "baseline").items()},
        noise_floor=read(paths.noise_floor_record(target), "noise_floor"),
        randomized=randomized,
        ablations={k: honest_clock(r) for k, r in grid(
            [a["name"] for a in spec.get("ablations", [])], paths.ablation_record,
            "ablation").items()},
        tile_choices={(v, p["name"]): records.read(path, "tile_choice")
                      for v in tile_table.tuned_variants(spec, target)
                      for p in spec["points"]
                      if Path(path := paths.tile_choice_record(target, case, v, p["name"]))
                      .exists()},
        check_power={p["name"]: r for p in spec["points"]
                     if (r := read(paths.check_power_record(target, case, p["name"]),
                                   "check_power")) is not None},
        compare={p["name"]: r for p in spec["points"]
                 if (r := read(paths.compare_record(target, case, p["name"]), "compare"))
                 is not None},
        sources=sources,
        kernel_sources_sha256=provenance.kernel_sources_sha256(case),
        current_sha256={
            **{(v, None): provenance.job_sha256(spec, v) for v in variants},
            **{(v, p["name"]): provenance.job_sha256(spec, v, p["name"])
               for v in variants for p in spec["points"]},
            **{(None, p["name"]): provenance.job_sha256(spec, point=p["name"])
               for p in spec["points"]}},
    )


def lowered_launches(ev: Evidence) -> list[dict[str, Any]]:
    """Every lowered kernel launch in the build records that states its shared memory."""
    rows = []
    for variant, build in ev.builds.items():
        for point in build["points"]:
            launches = [a for a in point.get("artifacts", [])
                        if "dynamic_smem_bytes" in a["facts"]]
            for artifact in launches:
                rows.append({"variant": variant, "point": point["point"],
                             "build_only": point.get("build_only", False),
                             "target": artifact["target"], **artifact["facts"],
                             "kernels_in_build": len(launches)})
    return rows


KERNEL_NAME_CHARS = 32  # a (mangled) kernel name is cut to this in labels


def launch_name(row: dict[str, Any]) -> str:
    """The variant, and which of its kernels (facts["kernel"], cut short) where its build
    at the point lowers to several."""
    kernel = row.get("kernel") if row.get("kernels_in_build", 1) > 1 else None
    if not kernel:
        return row["variant"]
    if len(kernel) > KERNEL_NAME_CHARS:
        kernel = kernel[:KERNEL_NAME_CHARS - 1] + "…"
    return f"{row['variant']} {kernel}"
