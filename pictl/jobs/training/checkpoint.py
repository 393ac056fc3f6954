"""The trained model as one file: the ranks' weights merged into a `.safetensors` model artifact.

Each rank writes the tensors it trained under their names in the whole model (a stage holds only its
own), so merging is a union. The file's header carries `remote.floor.artifact_meta.ArtifactMeta` (model,
constructor arguments, classes, head counts), so `pictl run --model FILE` rebuilds the architecture
and `pictl run --checkpoint FILE` loads it into the named model. Read and written with safetensors'
numpy API: no torch on the controller, nothing pickled.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from safetensors.numpy import load, save_file

from pictl import errors as E
from remote.floor.artifact_meta import ArtifactMeta

MODEL_FILE = "model.safetensors"


def merge_parts(parts: list[bytes], meta: ArtifactMeta, target: Path) -> dict[str, Any]:
    """Write the union of `parts` (safetensors bytes) to `target` atomically; what it holds."""
    tensors: dict[str, Any] = {}
    for data in parts:
        for name, array in load(data).items():
            if name in tensors:
                raise E.RunFailed(f"training: two ranks saved '{name}' (their stages overlap)")
            tensors[name] = array
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta.to_header())
        os.replace(tmp, target)
    except OSError as exc:  # a full disk: the trained weights are lost, and the job says so (exit 9)
        raise E.RecordWriteFailed(f"training: the merged weights could not be written to {target}: "
                                  f"{exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return {"path": str(target), "tensors": len(tensors), "params": int(sum(a.size for a in tensors.values())),
            "bytes": target.stat().st_size}


def trained_meta(model: str, num_classes: int, model_kwargs: dict[str, Any], heads: dict[str, int],
                 dataset: str, accuracy: dict[str, Any]) -> ArtifactMeta:
    return ArtifactMeta(base_model=model, num_classes=num_classes, heads=heads, model_kwargs=model_kwargs,
                        dataset=dataset, accuracy=accuracy, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
