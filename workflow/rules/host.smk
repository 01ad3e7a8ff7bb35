# The host stage: the hardware as found; no GPU gives a clean record saying so.


rule host:
    output:
        paths.host_record("{target}"),
    log:
        paths.log("host", "{target}"),
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/capture_host.py"
