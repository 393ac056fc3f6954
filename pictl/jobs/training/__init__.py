"""`pictl train`: training across hosts, single, pipeline-parallel or data-parallel.

    options.py     what a person asks for, checked before anything starts -> the hosts' TrainSpec
    telemetry.py   the ranks' lines folded: losses, top-1, time per category and rank, agreement
    checkpoint.py  the ranks' weights assembled into one safetensors file (`pictl run` takes it)
    session.py     one job: hosts, reference, launch and stream, collect, summary
"""
