# The baseline stage: the baselines named in the case config, checked and measured like the kernel.


rule baseline:
    input:
        case_inputs,
        paths.source(paths.PEAKS),  # the speed-of-light bound's peaks
        # Every interval is at least the host's floor wide: where a rerun lands.
        floor=paths.noise_floor_record("{target}"),
    output:
        record=paths.baseline_record("{target}", "{case}", "{baseline}", "{point}"),
        samples=paths.samples_table(paths.baseline_record("{target}", "{case}", "{baseline}", "{point}")),
    params:
        config=job_config("baseline", "point"),
        measurement=config["measurement"],
    log:
        paths.log("baseline", "{target}", "{case}", "{baseline}", "{point}"),
    threads: measure_threads
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/baseline.py"
