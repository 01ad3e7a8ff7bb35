# Stage 8: the static site: one page per case, a methods page, an index whose statuses
# come from records, and the static assets; raw records are copied in beside them.


rule page:
    input:
        case_file,
        lambda wildcards: case_manifests(wildcards.case),
    output:
        paths.site_page("{case}"),
    params:
        case_dir=config["case_dir"],
        targets=TARGETS,
        measured=MEASURED,
        title=config["site"]["title"],
    log:
        paths.log("site", "{case}"),
    script:
        "../scripts/page.py"


rule methods:
    input:
        [str(case_config.case_path(config["case_dir"], case)) for case in CASES],
        [m for case in CASES for m in case_manifests(case)],
        # Each host's A/A noise floor: the measured targets' are made by the noise rule.
        [
            p
            for t, p in zip(TARGETS, map(paths.noise_floor_record, TARGETS))
            if t in MEASURED or os.path.exists(p)
        ],
    output:
        paths.site_methods(),
    params:
        case_dir=config["case_dir"],
        cases=list(CASES),
        targets=TARGETS,
        measured=MEASURED,
        title=config["site"]["title"],
        protocol=config["measurement"],
    log:
        paths.log("site", "methods"),
    script:
        "../scripts/methods.py"


rule static:
    input:
        sorted(map(str, paths.STATIC_DIR.iterdir())),
    output:
        [paths.site_static(p.name) for p in sorted(paths.STATIC_DIR.iterdir())],
    log:
        paths.log("site", "static"),
    script:
        "../scripts/static.py"


rule index:
    input:
        [m for case in CASES for m in case_manifests(case)],
        pages=[paths.site_page(case) for case in CASES],
    output:
        paths.site_index(),
    params:
        case_dir=config["case_dir"],
        cases=list(CASES),
        targets=TARGETS,
        measured=MEASURED,
        title=config["site"]["title"],
    log:
        paths.log("site", "index"),
    script:
        "../scripts/index.py"


for _case in CASES:

    rule:
        name:
            _case
        input:
            paths.site_page(_case),
            paths.site_index(),
            rules.static.output,
