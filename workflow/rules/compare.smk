# The compare stage: at each point, the timed variants and baselines that compute the same outputs,
# measured interleaved in one job; their ratios are judged against the paired floor.


rule compare:
    input:
        case_inputs,
        tile_choice_input,
        point_records,
        floor=paths.noise_floor_record("{target}"),
    output:
        record=paths.compare_record("{target}", "{case}", "{point}"),
        samples=paths.samples_table(paths.compare_record("{target}", "{case}", "{point}")),
    params:
        config=job_config("point"),
        measurement=config["measurement"],
    log:
        paths.log("compare", "{target}", "{case}", "{point}"),
    # A measurement takes every core, so no other job runs beside it.
    threads: measure_threads
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/compare.py"
