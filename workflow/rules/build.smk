# Stage 3: lower/compile each variant at every point of the case's grid.


rule build:
    input:
        case_inputs,
        tile_table_input,
    output:
        paths.build_record("{target}", "{case}", "{variant}"),
    params:
        case_dir=config["case_dir"],
    log:
        paths.log("build", "{target}", "{case}", "{variant}"),
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/build.py"
