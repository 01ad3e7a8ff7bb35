# Stage 1: the environment actually found, against the hash-pinned lock.


rule env:
    input:
        lock=str(paths.lock_file(LOCK_PLATFORM)),
    output:
        paths.env_record("{target}"),
    params:
        lock_platform=LOCK_PLATFORM,
    log:
        paths.log("env", "{target}"),
    script:
        "../scripts/capture_env.py"
