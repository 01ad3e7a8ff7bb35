# Stage 2: the hardware as found; no GPU gives a clean record saying so.


rule host:
    output:
        paths.host_record("{target}"),
    log:
        paths.log("host", "{target}"),
    script:
        "../scripts/capture_host.py"
