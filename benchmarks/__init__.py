"""Speed of the keras_posenc layers against the memory floor and keras_hub, side by side.

Run `python -m benchmarks` from the repository root (`--help` for the options). Every
candidate is timed in one process, interleaved round by round, after warm-up; the
results go to `benchmarks/results/latest.json` and `latest.md`.
"""
