"""Validate a spec and print its stage plan, before anything is launched.

    python -m remote.runtime.plan --spec spec.json [--spec another.json ...]

Builds the model on the meta device only (no weights), checks split points, the
checkpoint's names and shapes, and the data set, then emits one `plan` event.
Exit 2 with an `error` event when the spec cannot work. `remote.runtime.serial --plan`
emits the same event first, saving a torch import when both are needed. With
several specs (a sweep's runs), one process plans them all, in order: each
`plan` event names its spec file, and the first spec that cannot work ends it.
"""

from __future__ import annotations

import argparse
import sys

from remote.data.images import check_data
from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.errors import BadInput
from remote.floor.run_records import Plan
from remote.floor.spec import RunSpec
from remote.toolkit.measure import run_main
from remote.toolkit.model import expected_shapes
from remote.toolkit.numerics import check_numerics
from remote.toolkit.outputs import open_checkpoint
from remote.toolkit.partition import split_point_names
from remote.toolkit.stage import compact_pieces, layout_for, stage_io_shapes


def emit_plan(spec: RunSpec, emitter: Emitter, spec_file: str | None = None) -> None:
    """Check the spec against the model, the checkpoint and the data; emit the stage plan (BadInput if not)."""
    if spec.chunk < 1 or spec.images < 1:
        raise BadInput("chunk and images must be at least 1")
    check_numerics(spec.numerics)  # before anything starts on the hosts
    layout = layout_for(spec)
    checkpoint = open_checkpoint(spec)
    if checkpoint is not None:
        checkpoint.check_fits(expected_shapes(layout.meta_model))
    check_data(spec.data, spec.images)
    shapes = stage_io_shapes(layout, spec.chunk)
    stages = [
        {"stage": s.index, "pieces": list(s.pieces), "params": s.params,
         "modules": compact_pieces(layout.pieces[s.first:s.end]),
         "input_shapes": [list(x) for x in shapes[s.index][0]],
         "output_shapes": [list(x) for x in shapes[s.index][1]]}
        for s in layout.stages
    ]
    emitter.emit(Plan(model=spec.model, split_points=split_point_names(layout.pieces, layout.stages),
                      total_params=sum(s.params for s in layout.stages), max_stages=len(layout.pieces),
                      num_classes=spec.num_classes, stages=stages, spec_file=spec_file,
                      cuts=[piece.name for piece in layout.pieces[1:]]))


def _plan_all(paths: list[str], emitter: Emitter) -> None:
    for path in paths:  # the caller knows which spec failed: the first without a plan
        emit_plan(RunSpec.load(path), emitter, spec_file=path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, action="append", help="a spec file (repeat for several)")
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_PIPELINE)
    return run_main(emitter, lambda: _plan_all(args.spec, emitter))


if __name__ == "__main__":
    sys.exit(main())
