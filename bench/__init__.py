"""pictl's benchmarks: one script per question, all on the harness in `bench.harness`.

Run them from the repository root as modules, e.g. `.venv/bin/python -m bench.waterfall --stages 2`;
every script takes `--quick` (few images, one round), and `make bench` runs every quick mode in turn.
"""
