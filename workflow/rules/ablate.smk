# The ablate stage: each ablation (a verified variant with one part switched off) lowered and
# timed at each point, where its variant passed verification; never verified itself.


rule ablate:
    input:
        case_inputs,
        tile_choice_input,
        paths.source(paths.PEAKS),  # the speed-of-light bound's peaks
        verify=ablated_verify,
        floor=paths.noise_floor_record("{target}"),
    output:
        record=paths.ablation_record("{target}", "{case}", "{ablation}", "{point}"),
        samples=paths.samples_table(paths.ablation_record("{target}", "{case}", "{ablation}",
                                                          "{point}")),
    params:
        config=ablation_config,
        measurement=config["measurement"],
    log:
        paths.log("ablate", "{target}", "{case}", "{ablation}", "{point}"),
    # As a time job: the whole machine, or one core for a host stand-in on target cpu.
    threads: time_threads
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/ablate.py"
