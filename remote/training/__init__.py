"""Training across hosts (`pictl train`): one process per rank, single, pipeline or data-parallel."""
