"""Names shared by the hosts (`remote/`) and the controller (`pictl/`).

Torch-free on purpose: the controller imports this module. Change a name here and
both sides change together; bump SCHEMA_VERSION when an event's fields change
meaning.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

# Every telemetry line is one JSON object with these keys, plus event-specific ones.
KEY_SCHEMA = "v"
KEY_EVENT = "event"
KEY_TIME = "t"
KEY_ROLE = "role"  # "pipeline" or "serial"
KEY_RANK = "rank"
KEY_HOST = "host"

ROLE_PIPELINE = "pipeline"
ROLE_SERIAL = "serial"
ROLE_PRUNE = "prune"

# Event names.
RUN_START = "run_start"
STAGE_READY = "stage_ready"
PROGRESS = "progress"
THROUGHPUT = "throughput"
ACCURACY = "accuracy"
RUN_END = "run_end"
ERROR = "error"
PLAN = "plan"
OUTPUTS = "outputs"
FIRST_OUTPUT = "first_output"  # the last stage finished its first microbatch (time to first image)
COSTS = "costs"  # per-piece time and per-cut bytes on one host (remote.profiling.costs, for `balanced`)
TRACE = "trace"  # a rank wrote its profiler trace of a window of steps (remote.runtime.tracing)
REFINE = "refine"  # rank 0 measured a split during the run and corrected the cost table (`balanced`)
REFINED = "refined"  # refinement is over: the split the timed passes run, its prediction, the corrections
STAGE_MOVED = "stage_moved"  # a rank's stage after refinement: its modules, pieces and params
PRUNE_START = "prune_start"  # remote.pruning.prune: base model's params and MACs, data set sizes
PRUNE_PROGRESS = "prune_progress"  # a fine-tuning step: epoch, step, loss, images/s
PRUNE_ACCURACY = "prune_accuracy"  # top-1 before pruning, right after, after each epoch
PRUNE_DONE = "prune_done"  # the artifact is complete: its path and metadata

EVENTS = (RUN_START, STAGE_READY, PROGRESS, THROUGHPUT, ACCURACY, RUN_END, ERROR, PLAN, OUTPUTS, FIRST_OUTPUT,
          COSTS, TRACE, REFINE, REFINED, STAGE_MOVED, PRUNE_START, PRUNE_PROGRESS, PRUNE_ACCURACY, PRUNE_DONE)

# Threads for this process, set per host by the controller (`--threads 0` divides a host's cores
# among the stages it runs); it overrides the spec's single value.
ENV_THREADS = "PICTL_THREADS"

# Files a run leaves in its directory on each host (relative to the host run dir).
SPEC_FILE = "spec.json"
LOGITS_FILE_PIPELINE = "logits-pipeline.f32"
LOGITS_FILE_SERIAL = "logits-serial.f32"
TRACE_REQUEST_FILE = "trace-request.json"  # written (atomically) on host 0 to ask for a trace window
TRACES_DIR = "traces"  # traces/<id>/rank<r>.json.gz
OWNER_FILE = "owner"  # the controller that started the run (`pictl stop` stops only its own unless --all)
TRACE_COMPUTE_RANGE = "pictl:compute"  # the profiler range around each microbatch's forward, "pictl:compute <step>"


def trace_file(rank: int) -> str:
    return f"rank{rank}.json.gz"

# Exit status of the remote entry points when the input itself is wrong
# (unknown split point, shapes that do not fit, missing data): the controller maps
# it to its own "bad input" exit code without starting anything else.
EXIT_BAD_INPUT = 2
EXIT_RUNTIME_ERROR = 1
