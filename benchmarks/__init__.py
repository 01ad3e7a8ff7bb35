"""Benchmarks of the measurement engine (not tests): calibration, efficiency, GPU check.

Run from the repository root: ``make bench`` (CPU) or ``.venv/bin/python -m
benchmarks.gpu_check OUT`` on a GPU host. Results are written to benchmarks/results/.
"""
