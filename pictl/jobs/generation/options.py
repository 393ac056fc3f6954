"""A generation job as a person asks for it, checked before anything starts: the model (a directory of
`config.json` and safetensors on the hosts, or an architecture with sizes), where the stages begin, the prompts,
and the spec the hosts get (`remote.floor.spec.GenerateSpec`).

Torch-free: the model's layer count and sizes come from its configuration as numbers (a directory's `config.json`
read from the first host, or the sizes given), which is all the cut and memory checks need.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pictl import errors as E
from pictl.validation import Namer, problem_line
from remote.floor.spec import DECODER_ARCHS, GenerateSpec

Arch = Literal["llama", "qwen2", "qwen3", "mistral"]
assert set(DECODER_ARCHS) == set(Arch.__args__)  # type: ignore[attr-defined]

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"num_hidden_layers": 8, "hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096},
    "qwen2.5-0.5b": {"num_hidden_layers": 24, "hidden_size": 896, "intermediate_size": 4864,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0},
}
"""Named model sizes for `--size` (a configuration's numbers; the weights are seeded random). `qwen2.5-0.5b` is
Qwen2.5-0.5B's configuration (494M parameters)."""
Size = Literal["tiny", "qwen2.5-0.5b"]
assert set(SIZES) == set(Size.__args__)  # type: ignore[attr-defined]
SIZE_ARCH: dict[str, Arch] = {"qwen2.5-0.5b": "qwen2"}
"""The architecture a named size is built as when `--arch` is not given."""

MAX_PROMPTS = 256
MAX_PROMPT_TOKENS = 4096


class GenerateOptions(BaseModel):
    """Everything that defines one generation job."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, min_length=1, max_length=4096)
    """A model directory on the hosts (`config.json` and safetensors); None: built from `arch` and `size`."""
    arch: Arch = "llama"
    size: Size = "tiny"
    layers: int | None = Field(default=None, ge=1, le=1024)
    """Over the size's decoder layers."""
    stages: int = Field(default=2, ge=1, le=128)
    split: list[int] = []
    """The first decoder layer of stages 2..N; empty: cut by `policy`."""
    policy: Literal["equal", "balanced"] = "balanced"
    """Without `split`: `equal` layers per stage, or `balanced` weights read per token (the last stage's head
    counts: Qwen2.5-0.5B's is as large as 9 of its 24 layers)."""
    sequences: int = Field(default=4, ge=1, le=MAX_PROMPTS)
    new_tokens: int = Field(default=16, ge=1, le=8192)
    prompt_tokens: int = Field(default=8, ge=1, le=MAX_PROMPT_TOKENS)
    prompts: Annotated[list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1,
                                                                              max_length=MAX_PROMPT_TOKENS)]],
                       Field(min_length=1, max_length=MAX_PROMPTS)] | None = None
    """Token ids of each sequence's prompt (`--prompts FILE`); None: seeded synthetic ids."""
    numerics: Literal["fp32", "int8-dynamic"] = "fp32"
    """`int8-dynamic`: a bounded loss, measured against an fp32 serial run beside the int8 one."""
    warmup_tokens: int = Field(default=2, ge=0, le=64)
    threads: int = Field(default=1, ge=1, le=256)
    seed: int = Field(default=0, ge=0)

    def sizes(self) -> dict[str, Any]:
        """The configuration's numbers over the architecture's defaults (a model built from its configuration)."""
        sizes = dict(SIZES[self.size])
        if self.layers is not None:
            sizes["num_hidden_layers"] = self.layers
        # Given, not left to the architecture: Qwen3's default head is 128 wide whatever the width, and the cut and
        # memory checks here must count the model the hosts build.
        sizes.setdefault("head_dim", sizes["hidden_size"] // sizes["num_attention_heads"])
        return sizes

    def prompt_ids(self, vocab: int) -> list[list[int]]:
        """The prompts' token ids: as given, or `sequences` seeded draws of `prompt_tokens` ids."""
        if self.prompts is not None:
            return self.prompts
        draw = random.Random(self.seed)
        return [[draw.randrange(vocab) for _ in range(self.prompt_tokens)] for _ in range(self.sequences)]

    def spec(self, job_id: str, model: ModelShape, split: list[int]) -> GenerateSpec:
        return GenerateSpec(model_dir=self.model, arch=self.arch, sizes={} if self.model else self.sizes(),
                            split=split, prompts=self.prompt_ids(model.vocab), new_tokens=self.new_tokens,
                            warmup_tokens=self.warmup_tokens, seed=self.seed, threads=self.threads,
                            numerics=self.numerics, run_id=job_id)

    @property
    def label(self) -> str:
        model = self.model or f"{self.arch} ({self.size}{f', {self.layers} layers' if self.layers else ''})"
        return model if self.numerics == "fp32" else f"{model}, {self.numerics}"


class ModelShape(BaseModel):
    """The numbers of a decoder-only model's configuration that placing it needs (no torch, no transformers)."""

    model_config = ConfigDict(extra="ignore")

    model_type: str
    layers: int = Field(ge=1, alias="num_hidden_layers")
    hidden: int = Field(ge=1, alias="hidden_size")
    intermediate: int = Field(ge=1, alias="intermediate_size")
    heads: int = Field(ge=1, alias="num_attention_heads")
    kv_heads: int | None = Field(default=None, ge=1, alias="num_key_value_heads")
    vocab: int = Field(ge=1, alias="vocab_size")
    tied: bool = Field(default=False, alias="tie_word_embeddings")
    head_dim_given: int | None = Field(default=None, ge=1, alias="head_dim")

    @property
    def head_dim(self) -> int:
        """A head's width: the configuration's `head_dim` where it says (Qwen3's is 128 by default), else
        hidden / heads."""
        return self.head_dim_given or self.hidden // self.heads

    def layer_params(self) -> int:
        """One decoder layer: attention (q and o over every head, k and v over the KV heads), the gated MLP (three
        matrices), two norms."""
        q = self.heads * self.head_dim
        kv = (self.kv_heads or self.heads) * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def kv_bytes_per_position(self, layers: int) -> int:
        """The KV cache one sequence's position takes over `layers` layers: a key and a value per KV head, fp32."""
        return layers * 2 * (self.kv_heads or self.heads) * self.head_dim * 4

    def stage_params(self, first: int, end: int) -> int:
        """The parameters a stage over layers [first, end) holds: its layers, the embedding on the first, the final
        norm and head on the last (a tied head is the embedding's tensor, held again only on another stage)."""
        params = (end - first) * self.layer_params()
        if first == 0:
            params += self.vocab * self.hidden
        if end == self.layers:
            params += self.hidden + (0 if self.tied and first == 0 else self.vocab * self.hidden)
        return params


def shape_of(config: dict[str, Any], where: str) -> ModelShape:
    """A configuration's numbers, or ConfigError naming `where` it came from and the field."""
    try:
        shape = ModelShape.model_validate(config)
    except ValidationError as exc:
        raise E.ConfigError(f"{where}: {problem_line(exc, ModelShape)}") from None
    if shape.model_type not in DECODER_ARCHS:
        raise E.ConfigError(f"{where}: model_type {shape.model_type!r} is not one pictl generate cuts between "
                            f"decoder layers ({', '.join(DECODER_ARCHS)})")
    return shape


def built_shape(options: GenerateOptions) -> ModelShape:
    """The shape of a model built from its architecture: the size's numbers (a default it leaves is the
    architecture's; the sizes pictl names give every field the checks read)."""
    return shape_of({"model_type": options.arch, **options.sizes()}, f"--arch {options.arch} --size {options.size}")


def stage_starts(options: GenerateOptions, shape: ModelShape, model: str) -> list[int]:
    """The first layer of stages 2..N: `--split` checked against the model's layers (a cut inside a layer, out of
    order or past the end is refused, naming the valid cuts), else cut by the options' policy."""
    stages, split, layers = options.stages, options.split, shape.layers
    valid = f"1..{layers - 1}" if layers > 1 else "none"
    if stages > layers:
        raise E.ConfigError(f"--stages {stages}: {model} has {layers} decoder layer(s); a stage needs at least one")
    if split:
        if len(split) != stages - 1:
            raise E.ConfigError(f"--split {','.join(map(str, split))}: {stages} stages need {stages - 1} cut(s) "
                                f"(the first decoder layer of stages 2..{stages}; {model}'s valid cuts: {valid})")
        if any(not 0 < c < layers for c in split) or any(b <= a for a, b in zip(split, split[1:], strict=False)):
            raise E.ConfigError(f"--split {','.join(map(str, split))}: cuts are decoder layers in increasing order "
                                f"between the first and the last ({model}'s valid cuts: {valid})")
        return list(split)
    if options.policy == "balanced":
        return balanced_starts(shape, stages)
    base, extra = divmod(layers, stages)
    counts = [base + (1 if i < extra else 0) for i in range(stages)]
    return [sum(counts[:i]) for i in range(1, stages)]


def balanced_starts(shape: ModelShape, stages: int) -> list[int]:
    """The cuts that make the largest stage's weights read per token smallest: decoding one token reads every
    weight of a stage once (a matrix-vector product per sequence: memory-bound on a CPU), so a stage's time
    per token goes with its layers' parameters and, on the last, the head's. The embedding is a lookup of
    one row per token and costs nothing here. (Parameters, not a measured cost: a host's speed is not known.)

    The layers weigh the same, so the search is over how many the last stage holds beside the head (the others
    share the rest as evenly as they divide, the extra layer to the later ones): linear in the layers."""
    layers, per_layer, head = shape.layers, shape.layer_params(), shape.vocab * shape.hidden
    if stages == 1:
        return []
    others = stages - 1

    def heaviest(last: int) -> int:
        return max(head + last * per_layer, -(-(layers - last) // others) * per_layer)

    last = min(range(1, layers - others + 1), key=heaviest)  # (the first of equals: the fewest beside the head)
    base, extra = divmod(layers - last, others)
    counts = [base + (1 if i >= others - extra else 0) for i in range(others)]
    return [sum(counts[:i]) for i in range(1, others + 1)]


def read_prompts(path: Path) -> list[list[int]]:
    """`--prompts FILE`: a JSON list of token-id lists (one per sequence), or ConfigError naming the file."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise E.ConfigError(f"--prompts {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if (not isinstance(raw, list) or not raw or len(raw) > MAX_PROMPTS
            or not all(isinstance(p, list) and 0 < len(p) <= MAX_PROMPT_TOKENS for p in raw)
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for p in raw for t in p)):
        raise E.ConfigError(f"--prompts {path}: expected a JSON list of 1..{MAX_PROMPTS} lists of 1.."
                            f"{MAX_PROMPT_TOKENS} token ids (integers >= 0)")
    return raw


def generate_options(values: dict[str, Any], *, name_of: Namer = str) -> GenerateOptions:
    """`values` (None: not given) as checked options; ConfigError names the field as the caller calls it."""
    try:
        options = GenerateOptions.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise E.ConfigError(problem_line(exc, GenerateOptions, name_of=name_of)) from None
    if "arch" not in options.model_fields_set and options.size in SIZE_ARCH:
        options.arch = SIZE_ARCH[options.size]  # (a named size is its own architecture unless told otherwise)
    if options.prompts is not None and "sequences" in options.model_fields_set and \
            options.sequences != len(options.prompts):
        raise E.ConfigError(f"{name_of('sequences')} {options.sequences}: the prompts give {len(options.prompts)} "
                            "sequence(s)")
    return options
