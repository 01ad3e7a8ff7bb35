# Stage 5a: this host's noise floor, from an A/A protocol, printed beside every comparison.


rule noise_floor:
    input:
        paths.env_record("{target}"),
        paths.host_record("{target}"),
    output:
        paths.noise_floor_record("{target}"),
    params:
        measurement=config["measurement"],
    log:
        paths.log("noise_floor", "{target}"),
    # A measurement takes every core, so no other job runs beside it.
    threads: measure_threads
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/noise_floor.py"
