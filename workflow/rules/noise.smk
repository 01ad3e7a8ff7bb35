# The noise floor stage: this host's noise floor, from an A/A protocol, printed beside every comparison.


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
    # First, when env and host leave both cores free: every time job waits for it, and
    # later one-core jobs would keep a core busy and hold it back to the run's end.
    priority: 2
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/noise_floor.py"
