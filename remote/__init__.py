"""Code that runs on the cluster hosts: model, partition, pipeline and serial runners.

Everything here may import torch; nothing in `pictl/` imports this package except
`remote.protocol` and `remote.spec`, which are torch-free by design.
"""
