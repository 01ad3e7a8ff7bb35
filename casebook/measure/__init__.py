"""The measurement engine: every time and baseline record in the pipeline comes from it.

Measuring, stopping and summarising are kept apart, as NVBench keeps them:

- ``engine``: the loop (warm-up, samples, guards) and its ``Settings``;
- ``stopping``: swappable criteria (median precision, relative noise with plateau,
  fixed count, time budget) that see only sample times;
- ``clocks``: host clock, CUDA events, CUPTI kernel activity;
- ``cache``: hot, or cold (input rotation past the LLC on CPU, L2 flush on GPU);
- ``throttle``: NVML clock and slowdown reasons per sample;
- ``guards``: early return, unseen streams, reused results;
- ``stats``: the median's interval (run-to-run over repeats), ratio of medians with a
  bootstrap interval, verdicts;
- ``noise``: the host's A/A noise floor;
- ``samples_file``: the raw samples, in a CSV beside every record;
- ``pinning``: a cpu job's process on one CPU, pinned before jax starts;
- ``gpu``: cuda-python / NVML / CUPTI found, or the reason there is no GPU.
"""
