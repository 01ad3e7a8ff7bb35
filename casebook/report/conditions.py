"""The six conditions of a figure, assembled from records: nothing here is typed by hand."""

from __future__ import annotations

import os
from typing import Any

from casebook.core import cases, config, paths, speed_of_light
from casebook.core.fmt import bytes_, seconds
from casebook.measure import stats
from casebook.report.evidence import Evidence, subject

HEADINGS = {
    "reference": "Reference",
    "hardware_software": "Hardware and software",
    "correctness": "Correctness",
    "measurement": "Measurement",
    "baseline": "Baseline",
    "reproduction": "Reproduction",
}


def reference(ev: Evidence) -> list[str]:
    ref = ev.spec["reference"]
    version = ev.env["packages"].get(ref["package"], "not installed")
    lines = [
        f"Kernel: {ref['kernel']} ({ref['entry_point']})",
        f"Source: {ref['repository']} · {ref['path']}",
        f"Version: {ref['package']} {version}, as installed (environment record)",
    ]
    for variant, build in ev.builds.items():
        digest = build["reference_source"]["sha256"]
        lines.append(f"Source file as installed ({variant}): sha256 {digest[:16]}…" if digest
                     else f"Source file ({variant}): not installed on this host, nothing "
                          f"imported (the port follows the repository and path above)")
    lines.append(f"Port target: {ev.spec['target']}")
    return lines


def hardware_software(ev: Evidence) -> list[str]:
    host, env = ev.host, ev.env
    cpu = host["cpu"]
    lines = []
    for gpu in host["gpus"]:
        extra = ", ".join(f"{k.replace('_', ' ')} {gpu[k]}" for k in ("sm_count",) if k in gpu)
        lines.append(
            f"GPU: {gpu['name']}, compute capability {gpu['compute_capability']}, "
            f"{bytes_(gpu['memory_bytes'])}" + (f", {extra}" if extra else "")
            + (f", L2 {bytes_(gpu['l2_cache_bytes'])}" if "l2_cache_bytes" in gpu else "")
            + f"; driver {gpu['driver_version']}, CUDA {gpu['cuda_driver_version']}")
    for tpu in host.get("tpus", []):
        runtime = tpu["platform_version"].splitlines()
        lines.append(f"TPU: {tpu['name']}, {bytes_(tpu['memory_bytes'])} HBM; "
                     f"{runtime[1] if len(runtime) > 1 else runtime[0]}, jax {tpu['jax_version']}")
    if not host["gpus"] and not host.get("tpus"):
        lines.append(f"GPU: none ({host['gpu_status']})")
    lines.append(f"CPU: {cpu['model']}, {cpu['usable_cores']} usable of "
                 f"{cpu['logical_cores']} logical cores, {bytes_(cpu['memory_bytes'])} memory")
    lines.append(f"Python {env['python']['version']} on {env['os']['platform']}")
    packages = env["packages"]
    shown = [ev.spec["reference"]["package"], "jaxlib", "numpy", "nvidia-cutlass-dsl"]
    lines.append("Packages: " + ", ".join(f"{p} {packages[p]}" for p in dict.fromkeys(shown)
                                           if p in packages))
    # Other versions first, then missing packages; those the offline host is not given on
    # purpose (its bundle says why) are counted apart.
    bundled_out = [d["package"] for d in env["drift"] if "not_carried" in d]
    listed = sorted((d for d in env["drift"] if "not_carried" not in d),
                   key=lambda d: d["found"] is None)
    state = ("matches the lock" if env["matches_lock"] else
             f"DRIFT from the lock in {len(env['drift'])} package(s): " + ", ".join(
                 f"{d['package']} {d['found'] or 'missing'} (locked {d['locked']})"
                 for d in listed[:6]) + (f"; {len(bundled_out)} not given to this offline "
                                        f"host on purpose ({', '.join(bundled_out)})"
                                        if bundled_out else ""))
    lines.append(f"Environment {state}: {_locks(env)}")
    if env["tools"].get("nvcc"):
        lines.append(f"nvcc: {env['tools']['nvcc']}")
    if env.get("runtime_variables"):
        lines.append("Set for the run: " + ", ".join(
            f"{k}={v}" for k, v in env["runtime_variables"].items()))
    return lines


def correctness(ev: Evidence) -> list[str]:
    if not ev.verify:
        return ["Not verified on this target: no verification record"]
    first = next(iter(ev.verify.values()))
    lines = [f"Oracle: {first['oracle']}"]
    for dtype, output, tol in config.tolerance_rows(ev.spec):
        name = output or "out"
        rule = (f"{name} bit-exact (equal to the oracle)" if tol["atol"] == tol["rtol"] == 0
                else f"|{name} − oracle| ≤ {tol['atol']:g} + {tol['rtol']:g}·|oracle|, "
                     f"elementwise")
        lines.append(f"Tolerance ({dtype}): {rule}. Why: {tol['reason']}")
    modes = {c["execution"]["mode"] for r in ev.verify.values() for c in r["checks"]
             if "execution" in c}
    if modes:
        lines.append("Checked in: " + "; ".join(sorted(modes)))
    lines += [randomized_line(r) for r in ev.randomized]
    weak: dict[str, list[str]] = {}
    per_point = []
    for (variant, point), record in ev.verify.items():
        if not record["ran"]:
            per_point.append(f"{variant} @ {point}: not run here: {record['not_run_reason']}")
            continue
        power = ev.power(variant, point)
        if power is None or power["weak"]:
            weak.setdefault(variant, []).append(point)
        worst = record["worst_error_over_tolerance"]
        verdict = "passed" if record["passed"] else "FAILED: " + "; ".join(record["failures"])
        per_point.append(
            f"{variant} @ {point}: {verdict}; worst error "
            + (f"{worst:.3g}× tolerance" if worst is not None else "undefined")
            + f" (max |err| {record['max_abs_error']:.3g}), {record['trials']} random draws "
            f"per mode, seed {record['seed']}, "
            f"races found: {'yes' if record['races_found'] else 'no'}"
            + _per_element(record) + _every_element(record) + "; "
            + power_text(power, alarm=False))
    ran = {v: sum(1 for (w, _), r in ev.verify.items() if w == v and r["ran"]) for v in weak}
    # A weak check is said once (the alarm, never folded) for the variants weak at the
    # same points, each point's line (folded) saying what it lets through.
    alike: dict[tuple[tuple[str, ...], int], list[str]] = {}
    for variant, points in weak.items():
        alike.setdefault((tuple(points), ran[variant]), []).append(variant)
    lines += [f"{', '.join(variants)}: check power WEAK at {len(points)} of {count} verified "
              f"points{' each' if len(variants) > 1 else ''} ({', '.join(points)}); each "
              "point's line says what it lets through"
              for (points, count), variants in alike.items()]
    return lines + per_point


def power_text(power: dict[str, Any] | None, alarm: bool = True) -> str:
    """The check's power in words: mutants caught, the smallest bias detected, or WEAK
    naming the mutants it lets through (``alarm`` False: the weakness said, not shouted,
    where a variant's own line raises the alarm)."""
    weak = "WEAK" if alarm else "weak"
    if power is None:
        return f"check power: {weak}, not measured (no check_power record)"
    bias = ", ".join(f"{o} {b:.2g}" if b is not None else f"{o} none up to 100%"
                     for o, b in power["bias"].items())
    caught = f"{power['caught']}/{power['applicable']} mutants caught" + (
        " (as a check of poisoned outputs)" if power.get("poisoned") else "")
    if not power["weak"]:
        return f"check power: {caught}; smallest uniform bias detected, × the output's " \
               f"RMS: {bias}"
    return f"check power {weak}: {caught}, {power['why']}; smallest bias detected: {bias}"


def _per_element(record: dict[str, Any]) -> str:
    """A case's per-element tolerance (its own compare's atol_applied), where it has one."""
    applied = [o["atol_applied"] for c in record["checks"] for o in c.get("outputs", {})
               .values() if isinstance(o.get("atol_applied"), dict)]
    if not applied:
        return ""
    return (f"; per-element atol median {max(a['median'] or 0.0 for a in applied):.3g}, max "
            f"{max(a['max'] for a in applied):.3g}")


def _every_element(record: dict[str, Any]) -> str:
    """Where sampled rows were checked against the float64 oracle, what checked every
    element besides them (a case's cheaper reference on the device), and its worst."""
    found = [o["every_element"] for c in record["checks"]
             for o in c.get("outputs", {}).values() if "every_element" in o]
    if not found:
        return ""
    worst = [e["worst_error_over_tolerance"] for e in found]
    over = sum(e.get("elements_over", 0) for e in found)
    rows = [o["sampled"]["worst_error_over_tolerance"] for c in record["checks"]
            for o in c.get("outputs", {}).values()
            if "worst_error_over_tolerance" in o.get("sampled", {})]
    return (f"; every element also checked against the {found[0]['reference']} (worst "
            + (f"{max(worst):.3g}×" if None not in worst else "undefined: non-finite")
            + (f", {over} elements over" if over else "")
            + (f"; the sampled float64 rows' worst {max(rows):.3g}×"
               if rows and None not in rows else "") + ")")


def _worst_text(worst: dict[str, float | None]) -> str:
    return ", ".join(f"{name} {value:.3g}×" for name, value in worst.items() if value is not None)


def randomized_line(r: dict[str, Any]) -> str:
    """One randomized (fuzz) record in one line: draws, failures, worst per variant."""
    per_variant = "; ".join(
        f"{variant} ({v['examples']} draws, {v['failed']} failed): "
        f"{_worst_text(v['worst_error_over_tolerance'])}"
        for variant, v in r["per_variant"].items() if v["examples"])
    return (f"Randomized check ({r['description']}; {r['record']}, {r['execution']}): "
            f"{r['examples']} random problems, {r['failed']} failed, races found in "
            f"{r['races']}, seed {r['seed']}; worst error / tolerance per variant: "
            f"{per_variant}")


def _measured_or_why(record: dict[str, Any]) -> str:
    if not record["timed"]:
        return f"not timed ({record['not_timed_reason']})"
    m = record["measurement"]
    kernel = (f", kernels alone {seconds(m['kernel_median_s'])} (launch overhead "
              f"{seconds(m['launch_overhead_median_s'])} apart)" if "kernel_median_s" in m
              else "")
    spread = (f"{m['confidence']:.0%} interval of one run's samples" if m["interval"] ==
              "within-run" else f"where a rerun lands: {m['repeats']} repeats" + (
                  f", at least the host's ±{m['floor_applied']:.1%} floor"
                  if m["floor_applied"] is not None else ""))
    pinned = ("every thread on CPU " + str(m["pinned_cpu"]) if m["pinned_cpu"] is not None
              else "not pinned")
    beside = ", beside other jobs" if record.get("shared_host") else ""
    return (f"median {seconds(m['median_s'])} [{seconds(m['ci_low_s'])}, "
            f"{seconds(m['ci_high_s'])}] ({spread}), n={m['samples']}, "
            f"noise {m['relative_noise']:.1%}{kernel}; clock {m['clock_kind']}, {pinned}{beside}; "
            f"stopped by {m['stop_criterion']}: {m['stop_reason']}; "
            f"{m['throttling']['discarded']} throttled samples discarded")


def floor_text(ev: Evidence) -> str:
    """The host's noise floor in one line, or that none is recorded."""
    return floor_line(ev.noise_floor)


def floor_line(nf: dict[str, Any] | None) -> str:
    """A noise-floor record in one line, or that none is recorded."""
    if nf is None:
        return ("Noise floor: none recorded for this host, so no speedup is printed "
                "(verdicts only)")
    paired = nf["paired"]
    return (f"Noise floor: ±{nf['noise_floor']:.1%} between separate measurements — the "
            f"minimum detectable effect of two records made apart, and where a rerun lands "
            f"({nf['quantile']:.0%} quantile of |ln A/A′| over {nf['rounds']} A/A rounds, "
            f"one measurement after the other, of a {nf['workload']}, "
            f"{seconds(nf['median_s'])} per call, {nf['repeats']} repeats per measurement, "
            f"{nf['clock_kind']} clock, "
            + ("not pinned" if nf["pinned_cpu"] is None else f"pinned to CPU {nf['pinned_cpu']}")
            + f"); ±{paired['noise_floor']:.1%} between two workloads measured interleaved, "
            f"sample by sample in one measurement (the same quantile over "
            f"{paired['rounds']} such A/A measurements, {paired['samples_per_series']} "
            f"samples of each): the host's drift cancels in their ratio"
            + "".join(f"; the {name} floor is one step of the clock "
                      f"({seconds(r['clock_resolution_s'])}), wider than its rounds' spread"
                      for name, r in (("separate", nf), ("interleaved", paired))
                      if r.get("floor_set_by") == "clock resolution"))


def _per_kind(timed: dict[Any, dict[str, Any]], gpus: list[Any], fact) -> str:
    """``fact`` of every timed record: once where all agree, else each value followed by
    the kinds of execution (``evidence.subject``) measured so: a host stand-in and an XLA
    baseline on one page are measured with different protocols."""
    kinds: dict[str, list[str]] = {}
    for record in timed.values():
        found = kinds.setdefault(fact(record), [])
        if (kind := subject(record["execution"], gpus)) not in found:
            found.append(kind)
    if len(kinds) == 1:
        return next(iter(kinds))
    return "; ".join(f"{value} ({', '.join(names)})" for value, names in kinds.items())


def measurement(ev: Evidence) -> list[str]:
    timed = {k: r for k, r in [*ev.time.items(), *ev.baselines.items()] if r["timed"]}
    lines = []
    if timed:
        gpus = ev.host["gpus"]
        lines.append("Clock: " + _per_kind(timed, gpus, lambda r: r["measurement"]["clock"]))
        modes = {r["execution"]["mode"]: r["execution"]["interpret"]
                 for r in ev.time.values() if r["timed"]}
        if modes:
            shared = any(r.get("shared_host") for r in ev.time.values())
            lines.append(f"Execution on {ev.target.upper()}: " + "; ".join(
                mode + (" — interpret-mode host time, NOT GPU device time" if interpret
                        else "") for mode, interpret in modes.items())
                + ("; timed on one core beside other jobs" if shared else ""))
        lines.append("Warm-up: " + _per_kind(
            timed, gpus, lambda r: f"{r['measurement']['warmup_calls']} calls discarded"))
        lines.append("Cache state: " + _per_kind(
            timed, gpus, lambda r: r["measurement"]["cache"]["description"]))
        lines.append("Throttling: " + _per_kind(
            timed, gpus, lambda r: r["measurement"]["throttling"]["description"]))
        (name, point), first = next(iter(timed.items()))
        lines.append("Guards passed by every timed record (call returning early, work on "
                     f"an unseen stream, result reused across samples); {name} @ {point}'s: "
                     + "; ".join(f"{guard.replace('_', ' ')}: {g['detail']}"
                                 for guard, g in first["measurement"]["guards"].items()))
    for (variant, point), record in ev.time.items():
        lines.append(f"{variant} @ {point}: {_measured_or_why(record)}")
    lines += light_lines(ev)
    lines.append(floor_text(ev))
    return lines


def _bound_text(found: dict[str, Any]) -> str:
    return (f"{seconds(found['bound_s'])} on {found['gpu_name']} ({found['limited_by']}-bound: "
            f"{found['flops']:,} FLOP at {found['peak_flops']:.3g} {found['math']} FLOP/s, "
            f"{found['bytes']:,} B at {found['memory_bytes_per_s']:.3g} B/s; "
            f"{found['basis']})")


def _measured_peaks_text(measured: dict[str, Any] | None,
                         datasheet: dict[str, Any] | None) -> str:
    """This host's own peaks, measured with its noise floor, beside the datasheet's
    (``datasheet``: the GPU's entry; None on a CPU host, where no GPU bound applies)."""
    if not measured:
        return ("This host's own matmul and copy peaks: not measured (its noise-floor "
                "record was made before they were)")
    math = measured["matmul_math"]
    text = (f"This host's own peaks, measured with its noise floor: {math} matmul "
            f"{measured['matmul_flops']:.3g} FLOP/s, copy {measured['copy_bytes_per_s']:.3g} "
            f"B/s ({measured['basis']})")
    if datasheet is None:
        return text + "; no GPU's bound applies to this host's times"
    rate = datasheet["tensor_flops"].get(math)
    compute = (f"{rate:.3g} FLOP/s {math}" if rate is not None else
               f"the datasheet's tensor rates (it states none for {math})")
    return (text + f"; the bound uses {compute} and "
            f"{datasheet['memory_bytes_per_s']:.3g} B/s, the higher of these and the "
            f"datasheet's")


def light_lines(ev: Evidence) -> list[str]:
    """The speed-of-light bound beside each GPU measurement and the fraction of it the
    median reaches; on a CPU target, each point's bound on every GPU of
    ``configs/peaks.yaml``, never measured. None for a case that states no work."""
    if not (paths.kernel_dir(ev.case) / "__init__.py").exists():
        return []  # no plug-in to state the work (records of a case not shipped here)
    plugin = cases.load(ev.case)
    if not hasattr(plugin, "work"):
        return []
    params = {p["name"]: p["params"] for p in ev.spec["points"]}
    measured = (ev.noise_floor or {}).get("peaks")
    if ev.target != "cpu":
        entry = speed_of_light.with_measured(speed_of_light.peaks()[ev.target], measured)
        lines = [_measured_peaks_text(measured, entry)]
        for kind, found in (("time", ev.time), ("baseline", ev.baselines)):
            for (name, point), r in found.items():
                bound = r.get("speed_of_light")
                if bound is None and r["timed"]:  # a record made before bounds were kept
                    outputs = (plugin.outputs(name) if kind == "time"
                               else plugin.baseline_outputs(name))
                    bound = speed_of_light.bound(plugin.work(params[point], outputs),
                                                 ev.target, entry)
                if bound is None:
                    continue
                reach = ("the median fell below it: refused as impossible" if not r["timed"]
                         else f"the median reaches "
                         f"{bound['bound_s'] / r['measurement']['median_s']:.1%} of it")
                lines.append(f"Speed of light, {name} @ {point}: {_bound_text(bound)}; {reach}")
        return lines
    computed = {tuple(plugin.outputs(v)) for v in ev.variants}
    lines = [_measured_peaks_text(measured, None)]
    for point in ev.points:
        for outputs in sorted(computed):
            work = plugin.work(params[point], outputs)
            bounds = [speed_of_light.bound(work, gpu) for gpu in speed_of_light.peaks()]
            lines.append(
                f"Speed of light @ {point} ({', '.join(outputs)}), not measured on GPU: "
                + ", ".join(f"{b['gpu'].upper()} {seconds(b['bound_s'])} ({b['limited_by']}"
                            f"-bound, {b['math']})" for b in bounds)
                + f" — {work['flops']:,} FLOP, {work['bytes']:,} B: {work['basis']}")
    return lines


def comparisons(ev: Evidence) -> dict[tuple[str, str, str], stats.Comparison]:
    """(variant, baseline, point) -> speedup of the variant over the baseline from the
    point's compare record: both measured interleaved in one job, the median of the
    per-round ratios judged against the host's paired floor. Only like is compared with
    like (``timing.comparable``)."""
    out = {}
    for point, record in ev.compare.items():
        for pair in record["pairs"]:
            if "why_not" not in pair:
                out[pair["variant"], pair["baseline"], point] = stats.Comparison(
                    pair["speedup"], pair["speedup_ci_low"], pair["speedup_ci_high"],
                    pair["noise_floor"], pair["verdict"], pair["design"])
    return out


def not_compared(ev: Evidence) -> dict[tuple[str, str, str], str]:
    """(variant, baseline, point) -> why a pair computing the same outputs was not
    compared."""
    return {(pair["variant"], pair["baseline"], point): pair["why_not"]
            for point, record in ev.compare.items() for pair in record["pairs"]
            if "why_not" in pair}


def comparison_text(c: stats.Comparison) -> str:
    """A speedup with its interval only when the interval clears the floor; else why not."""
    how = ("median of the per-round ratios of the two measured interleaved, and its "
           "order-statistic interval" if c.design == "paired"
           else "bootstrap interval of the ratio of medians")
    band = f"the ±{c.floor:.1%} {'paired ' if c.design == 'paired' else ''}noise floor"
    if c.printable:
        return f"{c.verdict}: {c.speedup:.3g}× [{c.low:.3g}, {c.high:.3g}] ({how}, clear of {band})"
    if c.floor is None:
        return f"{c.verdict} (no noise floor recorded for this host: no speedup printed)"
    if c.verdict == stats.SAME:
        return f"SAME (the whole interval lies inside {band})"
    return f"{c.verdict} (the interval reaches inside {band}: no speedup printed)"


def baseline(ev: Evidence) -> list[str]:
    lines = []
    for entry in ev.spec["baselines"]:
        role = {"without_work": "cost without the work",
                "best_alternative": "best available alternative"}[entry["role"]]
        lines.append(f"{entry['name']} ({role}): {entry['description'].strip()}")
    for (name, point), record in ev.baselines.items():
        lines.append(f"{name} @ {point}: {_measured_or_why(record)}")
    for (variant, name, point), c in comparisons(ev).items():
        lines.append(f"{variant} against {name} @ {point}: {comparison_text(c)}")
    for (variant, name, point), why in not_compared(ev).items():
        lines.append(f"{variant} against {name} @ {point}: {why}")
    lines.append(floor_text(ev))
    return lines


def _commits(ev: Evidence) -> list[str]:
    return sorted({r["commit"] for r in (*ev.verify.values(), *ev.time.values())}
                  or {ev.env["commit"]})


def command(ev: Evidence) -> str:
    """The shell command that remakes these records from their commit and lock."""
    return (f"git checkout {_commits(ev)[0].removesuffix('-dirty')} && make env "
            f"LOCK={ev.env['lock']['platform']} && .venv/bin/snakemake --cores all "
            f"--forceall --config target={ev.target} -- {ev.case}")


def _locks(env: dict[str, Any]) -> str:
    """The lock files an environment was installed from, with their digests."""
    found = [env["lock"], *([env["reference_lock"]] if "reference_lock" in env else [])]
    return " + ".join(f"{lock['file']} (sha256 {lock['sha256'][:16]}…)" for lock in found)


def _tiles(ev: Evidence) -> list[str]:
    """Which tile choices the timed kernels used (each point's tile_choice record), if any."""
    used = sorted({t["file"] for r in ev.time.values()
                   if (t := r.get("tile_table")) and t["applied"]})
    if used:
        where = used[0] if len(used) == 1 else f"{len(used)} under {os.path.commonpath(used)}/"
        return [f"Tiles: autotuned per point where a point's config gives none (tile_choice "
                f"records: {where})"]
    if "autotune" in ev.spec:
        return ["Tiles: the case config's rows, else the port's own choice (not autotuned)"]
    return []


def reproduction(ev: Evidence) -> list[str]:
    commits = _commits(ev)
    lines = [f"Project commit: {', '.join(commits)}",
             f"Command: {command(ev)}",
             f"Pinned inputs: {_locks(ev.env)}; kernel sources (the case's package and "
             f"the kernels/ modules it imports) sha256 {ev.kernel_sources_sha256[:16]}…, "
             f"hashed in each record with the slice of the case config it read"]
    lines += _tiles(ev)
    if any(c.endswith("-dirty") for c in commits):
        lines.append("WARNING: made from a working tree with uncommitted changes")
    if ev.stale:
        lines.append("STALE: some of these records were made from other kernel sources, "
                     "another case config or another tile-table row than the current ones"
                     + (f" (another row: {', '.join(f'{v} at {p}' for v, p in ev.retuned)})"
                        if ev.retuned else ""))
    return lines


def assemble(ev: Evidence) -> dict[str, list[str]]:
    return {
        "reference": reference(ev),
        "hardware_software": hardware_software(ev),
        "correctness": correctness(ev),
        "measurement": measurement(ev),
        "baseline": baseline(ev),
        "reproduction": reproduction(ev),
    }
