# The time stage: time the verified kernel; a point that failed verification is never timed.


rule time:
    input:
        case_inputs,
        tile_choice_input,
        paths.source(paths.PEAKS),  # the speed-of-light bound's peaks
        verify=paths.verify_record("{target}", "{case}", "{variant}", "{point}"),
        # Every interval is at least the host's floor wide: where a rerun lands.
        floor=paths.noise_floor_record("{target}"),
    output:
        record=paths.time_record("{target}", "{case}", "{variant}", "{point}"),
        samples=paths.samples_table(paths.time_record("{target}", "{case}", "{variant}", "{point}")),
    params:
        config=job_config("variant", "point"),
        measurement=config["measurement"],
    log:
        paths.log("time", "{target}", "{case}", "{variant}", "{point}"),
    # A measurement takes every core, so no other job runs beside it; a host stand-in for
    # the kernel on target cpu (stand_ins.is_stand_in) takes one (its host time is no speed
    # result).
    threads: time_threads
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/time.py"
