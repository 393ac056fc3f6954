from pictl.cli import entrypoint

entrypoint()
