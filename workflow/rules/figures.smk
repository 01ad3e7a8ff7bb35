# The figures stage: figures and their six-condition sidecars, for every target with records here.


# A checkpoint: the page's inputs are the figures and sidecars its manifest lists.
checkpoint figures:
    input:
        case_file,
        figure_inputs,
        paths.source(paths.PEAKS),  # the speed-of-light bound's peaks
    output:
        paths.figure_manifest("{case}", "{shown_target}"),
    params:
        measured=MEASURED,
    log:
        paths.log("figures", "{case}", "{shown_target}"),
    script:
        "../scripts/figures.py"
