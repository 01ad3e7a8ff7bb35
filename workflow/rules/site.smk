# Stage 8: the static site: one page per case and an index whose statuses come from records.


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
