# Stage 7: figures and their six-condition sidecars, for every target with records here.


rule figures:
    input:
        case_file,
        figure_inputs,
    output:
        paths.figure_manifest("{case}", "{shown_target}"),
    params:
        case_dir=config["case_dir"],
        measured=MEASURED,
    log:
        paths.log("figures", "{case}", "{shown_target}"),
    script:
        "../scripts/figures.py"
