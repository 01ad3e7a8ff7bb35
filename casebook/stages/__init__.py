"""The stages of the DAG (workflow/rules/*.smk), one module per stage or group of rules;
each workflow script calls one function of one of them.

- ``envcapture``: the env rule (env.smk), the environment record;
- ``hostcapture``: the host rule (host.smk), the host record;
- ``build``: the lower, lower_build_only and build rules (build.smk);
- ``verify``: the verify rule (verify.smk), the kernel against the float64 oracle;
- ``check_power``: the check_power rule (verify.smk), near-miss mutants through verify;
- ``bit_exact``: the bit_exact rule (verify.smk), a port against the kernel it ports;
- ``autotune``: the tile_choice and autotune rules (autotune.smk);
- ``tile_table``: the tile_table rule (autotune.smk), applied by build, verify and time;
- ``timing``: the noise_floor, time, baseline and compare rules (noise.smk, time.smk,
  baseline.smk, compare.smk);
- ``ablation``: the ablate rule (ablate.smk);
- ``point_job``: ``PointJob``, what every per-point job reads before its own work.

The figures and site rules are ``casebook.report``'s.
"""
