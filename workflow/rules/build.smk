# The build stage: lower/compile each variant at each point of the case's grid (one job per
# verified point, so that changing a point rebuilds and reverifies it alone; one job for a
# variant's build-only points), then gather the variant's build record. Lowering needs no
# GPU (its jobs keep jax off the device: casebook.run.off_device), so these are CPU jobs on a
# cluster too, and run beside the GPU jobs on a GPU host.


rule lower:
    input:
        case_inputs,
        tile_choice_input,
    output:
        paths.lowering_record("{target}", "{case}", "{variant}", "{point}"),
    params:
        config=job_config("variant", "point"),
    log:
        paths.log("build", "{target}", "{case}", "{variant}", "{point}"),
    script:
        "../scripts/lower.py"


# Only lowered: one Python start and jax import for all of a variant's build-only points.
rule lower_build_only:
    input:
        case_inputs,
        tile_choice_input,
    output:
        paths.build_only_lowerings("{target}", "{case}", "{variant}"),
    params:
        config=build_only_config,
    # The longest jobs start early, so that none ends the run alone on one core.
    priority: 1
    log:
        paths.log("build", "{target}", "{case}", "{variant}", "build_only_points"),
    script:
        "../scripts/lower_build_only.py"


rule build:
    input:
        lambda w: paths.lowering_records(CASES[w.case], w.target, w.variant),
    output:
        paths.build_record("{target}", "{case}", "{variant}"),
    log:
        paths.log("build", "{target}", "{case}", "{variant}"),
    script:
        "../scripts/build.py"
