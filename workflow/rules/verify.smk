# The verify stage: the kernel against the float64 oracle on fresh seeded inputs.


rule verify:
    input:
        case_inputs,
        tile_choice_input,
        lowered=paths.lowering_record("{target}", "{case}", "{variant}", "{point}"),
    output:
        paths.verify_record("{target}", "{case}", "{variant}", "{point}"),
    params:
        config=job_config("variant", "point"),
    log:
        paths.log("verify", "{target}", "{case}", "{variant}", "{point}"),
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/verify.py"


# The check-power stage: near-miss mutants of each point through verify's own check, on
# the target's device as verify checks there (splash attention's every-element reference
# past its dense oracle runs on the device).
rule check_power:
    input:
        case_inputs,
    output:
        paths.check_power_record("{target}", "{case}", "{point}"),
    params:
        config=job_config("point"),
    # The longest jobs start early, so that none ends the run alone on one core.
    priority: 1
    log:
        paths.log("check_power", "{target}", "{case}", "{point}"),
    resources:
        gpu=target_gpus,
        constraint=target_constraint,
    script:
        "../scripts/check_power.py"


# A port against the kernel it ports, bit for bit at every point (the case config's
# side_by_side.bit_exact), once both are built; on a host that cannot run them, its record
# says why.
rule bit_exact:
    input:
        case_inputs,
        lambda w: [paths.build_record(w.target, w.case, CASES[w.case]["side_by_side"][k])
                   for k in ("variant", "against")],
    output:
        paths.bit_exact_record("{target}", "{case}"),
    log:
        paths.log("bit_exact", "{target}", "{case}"),
    resources:
        gpu=target_gpus,
    script:
        "../scripts/bit_exact.py"
