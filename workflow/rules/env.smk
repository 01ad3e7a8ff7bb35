# The env stage: the environment actually found on the target's nodes, against its hash-pinned lock.


rule env:
    input:
        lock=lambda wildcards: paths.source(paths.lock_file(lock_platform(wildcards.target))),
        references=paths.source(paths.REFERENCE_LOCK),
    output:
        paths.env_record("{target}"),
    params:
        lock_platform=lambda wildcards: lock_platform(wildcards.target),
    log:
        paths.log("env", "{target}"),
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/capture_env.py"
