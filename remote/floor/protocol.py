"""Names shared by the hosts (`remote/`) and the controller (`pictl/`).

Torch-free on purpose: the controller imports this module. Change a name here and
both sides change together; bump SCHEMA_VERSION when an event's fields change
meaning (the fields themselves are the record classes of `remote.floor.records`).
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
ROLE_TRAIN = "train"
ROLE_GENERATE = "generate"

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
RECUT = "recut"  # the controller's watch saw the timed passes drift, corrected the hosts' factors, moved the cut or not
PASS_WATCHED = "pass_watched"  # rank 0: each stage's compute per microbatch in a timed pass, for the controller
STAGE_MOVED = "stage_moved"  # a rank's stage after refinement: its modules, pieces and params
PRUNE_START = "prune_start"  # remote.pruning.prune: base model's params and MACs, data set sizes
PRUNE_PROGRESS = "prune_progress"  # a fine-tuning step: epoch, step, loss, images/s
PRUNE_ACCURACY = "prune_accuracy"  # top-1 before pruning, right after, after each epoch
PRUNE_DONE = "prune_done"  # the artifact is complete: its path and metadata
TRAIN_START = "train_start"  # remote.training.train: mode, world, batch, chunks, steps, parameters
TRAIN_STEP = "train_step"  # one optimizer step on one rank: its time by category (and the loss, on the loss rank)
TRAIN_EVAL = "train_eval"  # top-1 on the held-out images after an epoch
TRAIN_END = "train_end"  # a rank finished: its totals by category and the file its weights went to
GEN_START = "gen_start"  # remote.generation.generate: a stage's layers, parameters, memory and load time
GEN_END = "gen_end"  # a stage finished the timed pass: its time by category per token, bytes sent, peak memory
MB_TIMES = "mb_times"  # a pass's microbatch wall times entering stage 0 / leaving the last (or the serial's durations)

EVENTS = (RUN_START, STAGE_READY, PROGRESS, THROUGHPUT, ACCURACY, RUN_END, ERROR, PLAN, OUTPUTS, FIRST_OUTPUT,
          COSTS, TRACE, REFINE, REFINED, RECUT, STAGE_MOVED, PRUNE_START, PRUNE_PROGRESS, PRUNE_ACCURACY, PRUNE_DONE,
          TRAIN_START, TRAIN_STEP, TRAIN_EVAL, TRAIN_END, MB_TIMES, PASS_WATCHED, GEN_START, GEN_END)

# The fields of each event, and their kinds, are declared once on its record class (`remote.floor.records`,
# `remote.floor.run_records`, `remote.floor.job_records`): the host builds one, the controller checks a line against it.

# Threads for this process, set per host by the controller (`--threads 0` divides a host's cores
# among the stages it runs); it overrides the spec's single value.
ENV_THREADS = "PICTL_THREADS"
ENV_OWNER = "PICTL_OWNER"
"""The controller a job on a host belongs to (`remote.host.warm`: what `pictl stop` matches in a warm process)."""
WARM_NOTE = "pictl-warm:"
"""How a warm client's note starts on a job's stderr (a job run cold, and why): shown once per host."""

# Files a run leaves in its directory on each host (relative to the host run dir).
SPEC_FILE = "spec.json"
LOGITS_FILE_PIPELINE = "logits-pipeline.f32"
LOGITS_FILE_SERIAL = "logits-serial.f32"
LOGITS_FILE_SERIAL_FP32 = "logits-serial-fp32.f32"
"""The fp32 reference of a run under other numerics (`--numerics`): what its bounded loss is measured against."""
TRACE_REQUEST_FILE = "trace-request.json"  # written (atomically) on host 0 to ask for a trace window


def recut_decision_file(after_pass: int) -> str:
    """Written (atomically) by the controller in rank 0's run directory once it has judged timed pass `after_pass`
    (`pass_watched`): the split the next pass runs, or null to keep this one. Rank 0 waits for it."""
    return f"recut-decision-{after_pass}.json"
TRACES_DIR = "traces"  # traces/<id>/rank<r>.json.gz
OWNER_FILE = "owner"  # the controller that started the run (`pictl stop` stops only its own unless --all)
TRACE_COMPUTE_RANGE = "pictl:compute"  # the profiler range around each microbatch's forward, "pictl:compute <step>"


def trace_file(rank: int) -> str:
    return f"rank{rank}.json.gz"


LOGITS_FILE_TRAINED = "logits-trained.f32"  # the trained model on the first evaluation images
TRAIN_TIME_KEYS = ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "idle_s")
"""Where a training step's time goes, per rank (they add up to the step's wall time)."""


def train_part_file(rank: int) -> str:
    """The weights a training rank ends with (its stage's, or the whole model under single and ddp)."""
    return f"weights-rank{rank}.safetensors"

# Exit status of the remote entry points when the input itself is wrong
# (unknown split point, shapes that do not fit, missing data): the controller maps
# it to its own "bad input" exit code without starting anything else.
EXIT_BAD_INPUT = 2
EXIT_RUNTIME_ERROR = 1
