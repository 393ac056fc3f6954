"""The inference pipeline: the torchrun entry (`pipeline`), the serial run (`serial`), planning (`plan`),
measured refinement (`refine`), replicas, and the timing and tracing of a run's passes. Built on
`remote.toolkit`."""
