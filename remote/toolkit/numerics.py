"""A stage's numerics: `fp32` as built, or `int8-dynamic`: every Linear layer's weights as int8 and its
input quantised per call (torch's eager dynamic quantization), on the host that runs the stage.

Why torch's `quantize_dynamic` and not torchao, which torch now points eager-mode users to: measured on
this machine kind (`bench/int8.py`: DeiT-S, batch 1, 1 thread, 4 interleaved rounds) it ran 3.63x fp32's
img/s against 1.96x for torchao's int8 dynamic-activation / int8-weight, and its kernels ship in every
torch wheel for both the controller's x86 (fbgemm / x86) and the Pi's aarch64 (qnnpack); torchao is
another dependency whose CPU int8 path is tuned for x86 servers. The engine is the best the host's torch
supports (`engine`), and the summary says which one ran.

A quantised stage is deterministic for a given microbatch (its activation scale is the microbatch's own,
its products are integer), so a pipeline under int8-dynamic matches a serial run under int8-dynamic bit
for bit; against fp32 it is a bounded loss, which the controller measures and reports apart.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from remote.floor.errors import BadInput

NUMERICS = ("fp32", "int8-dynamic")
ENGINES = ("x86", "fbgemm", "qnnpack")
"""In order of preference: x86 (fbgemm with onednn where faster) and fbgemm on x86 CPUs, qnnpack on ARM."""


def engine() -> str | None:
    """The quantised engine this host's torch offers (None: none that runs int8 Linear layers)."""
    supported = set(torch.backends.quantized.supported_engines)
    return next((e for e in ENGINES if e in supported), None)


def check_numerics(numerics: str) -> str | None:
    """The engine `numerics` will run on here (None: fp32); BadInput when it cannot run on this host."""
    if numerics not in NUMERICS:
        raise BadInput(f"numerics '{numerics}' is not one of {', '.join(NUMERICS)}")
    if numerics == "fp32":
        return None
    chosen = engine()
    if chosen is None:
        raise BadInput(f"numerics {numerics}: this host's torch has no quantised engine "
                       f"({', '.join(torch.backends.quantized.supported_engines) or 'none'})")
    return chosen


def apply_numerics(module: nn.Module, numerics: str) -> str | None:
    """Put `module` (its materialised Linear layers) in `numerics`, in place; the engine used, if any."""
    chosen = check_numerics(numerics)
    if chosen is None:
        return None
    torch.backends.quantized.engine = chosen
    with warnings.catch_warnings():  # torch.ao's notice that eager quantization moves to torchao (see above)
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return chosen
