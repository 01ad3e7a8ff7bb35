# Accelerator hosts only: measure each point's tile candidates (a GPU's: the port's tiles;
# a TPU's: upstream's block sizes), pick one, write the target's tile table (build, verify
# and time then apply it). Not part of `all`; `snakemake autotune` runs it, and refuses
# target cpu: interpreter times say nothing about an accelerator's speed.


rule tile_choice:
    input:
        case_inputs,
        floor=paths.noise_floor_record("{target}"),
    output:
        record=paths.tile_choice_record("{target}", "{case}", "{variant}", "{point}"),
        samples=directory(
            paths.tile_samples_dir(
                paths.tile_choice_record("{target}", "{case}", "{variant}", "{point}")
            )
        ),
    params:
        config=job_config("variant", "point"),
        measurement=config["measurement"],
    log:
        paths.log("autotune", "{target}", "{case}", "{variant}", "{point}"),
    # Each candidate is measured: the whole machine, as for time.
    threads: measure_threads
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/autotune.py"


rule tile_table:
    input:
        lambda w: [
            paths.tile_choice_record(w.target, w.case, v, p["name"])
            for v in autotuned(w.case, w.target)
            for p in paths.for_target(CASES[w.case], w.target)["points"]
        ],
    output:
        paths.tile_table("{target}", "{case}"),
    log:
        paths.log("autotune", "{target}", "{case}", "table"),
    script:
        "../scripts/tile_table.py"


rule autotune:
    input:
        autotune_tables,
