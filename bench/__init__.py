"""Benchmarks: `make bench` (python -m bench) prints one JSON document of figures.

The machine is shared and noisy, so every figure that matters is a ratio measured side by side in the
same run (ours against a floor on the same data), and repeated timings are reported as medians.
"""
