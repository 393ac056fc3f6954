"""The torch-free floor: what the controller (`pictl/`) and the hosts' code share, and the only part of
`remote/` the controller imports.

    contracts   protocol.py (event and file names), records.py, run_records.py, job_records.py (what a host
                sends, one frozen dataclass per event), spec.py (the run spec), errors.py, emit.py (JSON
                lines), artifact_meta.py (model artifact headers), wire.py (activation formats on the wire),
                entries.py (the programs the controller may start on a host), torch_support.py (the torch
                versions both sides support)
    solvers     balance.py (the split search), refinement.py (measured refinement of a split), recut.py
                (re-cuts between passes)
    files       nofollow.py (paths under a directory opened without following a link)

Nothing here imports torch, pictl or any other part of `remote/` (`tests/unit/test_architecture.py`).
"""
