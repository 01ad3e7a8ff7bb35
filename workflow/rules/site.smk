# The site stage: the static site. Each part (one page per case, a methods page, an index whose
# statuses come from records, the static assets) is rendered into its own folder under
# build/site/; the site rule merges them and puts the result in place of site/public/
# whole. A failed job leaves the published site as it was (update: Snakemake keeps it and
# restores it), and a page whose inputs do not read back is rendered as failed.


SHARED_PARTS = [paths.site_part(part) for part in ("index", "methods", "records", "static")]


rule page:
    input:
        case_file,
        figure_files,
        history_files,
    output:
        part=directory(paths.page_part("{case}")),
        status=paths.page_status("{case}"),
    params:
        targets=TARGETS,
        measured=MEASURED,
        site=config["site"],
    log:
        paths.log("site", "{case}"),
    script:
        "../scripts/page.py"


rule methods:
    input:
        [paths.source(case_config.case_path(config["case_dir"], case)) for case in CASES],
        [m for case in CASES for m in case_manifests(case)],
        # Each host's A/A noise floor: the measured targets' are made by the noise rule.
        [
            p
            for t, p in zip(TARGETS, map(paths.noise_floor_record, TARGETS))
            if t in MEASURED or os.path.exists(p)
        ],
        # The code whose docstrings the page quotes: the rules as the code states them.
        [paths.source(p) for p in paths.METHODS_QUOTES],
        paths.source(paths.PEAKS),  # the speed-of-light bound's peaks, quoted
        # The engine's benchmark records the page states (calibration, rerun coverage).
        [paths.source(p) for p in paths.PROTOCOL_CHECKS if p.exists()],
    output:
        directory(paths.site_part("methods")),
    params:
        cases=list(CASES),
        targets=TARGETS,
        measured=MEASURED,
        site=config["site"],
        protocol=config["measurement"],
    log:
        paths.log("site", "methods"),
    script:
        "../scripts/methods.py"


# Each target's environment, host and noise-floor records: linked by every page, copied
# into the site once. The measured targets' are made by their rules; others' if present.
rule records:
    input:
        [
            r
            for t in TARGETS
            for r in paths.target_records(t)
            if t in MEASURED or os.path.exists(r)
        ],
    output:
        directory(paths.site_part("records")),
    params:
        targets=TARGETS,
    log:
        paths.log("site", "records"),
    script:
        "../scripts/records.py"


rule static:
    input:
        sorted(map(paths.source, paths.STATIC_DIR.iterdir())),
    output:
        directory(paths.site_part("static")),
    log:
        paths.log("site", "static"),
    script:
        "../scripts/static.py"


rule index:
    input:
        [m for case in CASES for m in case_manifests(case)],
        statuses=[paths.page_status(case) for case in CASES],
    output:
        directory(paths.site_part("index")),
    params:
        cases=list(CASES),
        targets=TARGETS,
        measured=MEASURED,
        site=config["site"],
    log:
        paths.log("site", "index"),
    script:
        "../scripts/index.py"


rule site:
    input:
        [paths.page_part(case) for case in CASES],
        SHARED_PARTS,
    output:
        update(directory(paths.SITE)),
    log:
        paths.log("site", "publish"),
    script:
        "../scripts/publish.py"


for _case in CASES:

    rule:
        name:
            _case
        input:
            paths.SITE,
            SHARED_PARTS,
            case_products(_case),
