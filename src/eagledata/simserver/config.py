"""Settings of the simulated SGLang server, and the facts derived from them.

Every field can be changed at runtime through ``POST /_sim/control`` (the app re-validates the
merged settings), so derived values are methods, never cached copies.
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eagledata.errors import ConfigError
from eagledata.simserver import speculative as spec_sim
from eagledata.simserver.speculative import SimSpeculative

BF16_BYTES_PER_TOKEN = 70_272
"""Kimi-K2.5 / DeepSeek-V3 MLA latent: (512 + 64) values x 61 layers x 2 bytes, per GPU."""

DEFAULT_VOCAB_SIZE = 163_840
DEFAULT_EOS_TOKEN_ID = 163_586

Rate = Annotated[float, Field(ge=0.0, le=1.0)]


class SimConfig(BaseModel):
    """What the simulated server pretends to be, how fast it is, and which faults it injects."""

    model_config = ConfigDict(extra="forbid")

    # --- identity -------------------------------------------------------------------------
    model_path: str = "moonshotai/Kimi-K2.5"
    served_model_name: str | None = None
    tokenizer_path: str | None = None
    """A directory holding ``tokenizer.json``; used to decode ``text`` and find vocab/EOS."""
    vocab_size: int | None = Field(default=None, gt=10)
    eos_token_id: int | None = Field(default=None, ge=0)
    model_type: str = "kimi_k25"
    architectures: list[str] = Field(default_factory=lambda: ["KimiK25ForConditionalGeneration"])
    version: str = "0.5.9"

    # --- server args --------------------------------------------------------------------------
    kv_cache_dtype: str = "bf16"
    """The CLI string, reported verbatim at the top level of ``/server_info``."""
    internal_kv_cache_dtype: str | None = None
    """What ``internal_states`` report and generation uses. None: as ``kv_cache_dtype``, with
    ``auto`` resolved to bf16. Set ``fp8_e4m3`` to simulate the ``auto`` -> fp8 trap."""
    kv_bytes_per_token: int | None = Field(default=None, gt=0)
    dtype: str = "auto"
    quantization: str | None = None
    tp_size: int = Field(default=8, ge=1)
    dp_size: int = Field(default=1, ge=1)
    enable_dp_attention: bool = False
    mem_fraction_static: float = Field(default=0.85, gt=0.0, le=1.0)
    max_total_num_tokens: int = Field(default=116_000, gt=6)
    """KV pool of one DP rank, in tokens."""
    context_length: int = Field(default=262_144, gt=1)
    max_running_requests: int | None = Field(default=None, ge=1)
    max_queued_requests: int | None = Field(default=None, ge=0)
    chunked_prefill_size: int = 8192
    disable_radix_cache: bool = False
    enable_hierarchical_cache: bool = False
    enable_metrics: bool = True
    skip_tokenizer_init: bool = False
    api_key: str | None = None
    """``--api-key``: every route but ``/health*``, ``/metrics`` (and ``/_sim/*``) then needs
    ``Authorization: Bearer KEY``; anything else gets 401 ``{"error": "Unauthorized"}``."""

    # --- speculative decoding (simserver/speculative.py) -------------------------------------
    speculative: SimSpeculative | None = None
    """Report EAGLE-3 speculative decoding at a configured acceptance length; None: off."""

    # --- behaviour ------------------------------------------------------------------------------
    latency_s: float = Field(default=0.0, ge=0.0)
    """Fixed time per request once admitted (prefill + anything not modelled per token)."""
    decode_tok_per_s: float | None = Field(default=None, gt=0.0)
    """Per-sequence decode speed; adds completion_tokens / speed, slowed above decode_batch."""
    decode_batch: int = Field(default=256, ge=1)
    startup_s: float = Field(default=0.0, ge=0.0)
    """Health answers 503 for this long after the server starts."""
    healthy: bool = True
    """False makes ``/health`` answer 503 (a wedged server)."""
    length_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    """Share of requests that run to ``max_new_tokens`` instead of stopping on EOS."""
    seed: int = 0

    # --- the SGLang capacity engine (simserver/capacity.py; issue 9) ----------------------------
    engine: Literal["simple", "sglang"] = "simple"
    """``simple``: the latency/decode-speed model above. ``sglang``: a step-by-step model of
    SGLang's scheduler (KV pool filled as requests decode, admission with the decaying
    ``new_token_ratio``, retraction, batched step time); it ignores ``latency_s`` and
    ``decode_tok_per_s``."""
    step_base_s: float = Field(default=0.077, gt=0.0)
    step_per_request_s: float = Field(default=0.00018, ge=0.0)
    """Decode step time = base + per_request x running: tok/s = N / (0.077 + 0.00018 N), the
    reference fit (kimi-k25-capacity.md section 5)."""
    prefill_tok_per_s: float = Field(default=8000.0, gt=0.0)
    """Prefill speed of one prefill batch (an assumption: not measured on the reference rig)."""
    time_scale: float = Field(default=1.0, gt=0.0)
    """Every simulated step lasts ``time_scale`` x its modelled time (tests and benchmarks)."""
    steps_per_tick: int = Field(default=1, ge=1, le=64)
    """Decode steps simulated per timer tick (fewer Python wake-ups at the same arithmetic)."""
    schedule_conservativeness: float = Field(default=1.0, gt=0.0)
    init_new_token_ratio: float = Field(default=0.7, gt=0.0, le=1.0)
    min_new_token_ratio_factor: float = Field(default=0.14, gt=0.0, le=1.0)
    new_token_ratio_decay_steps: int = Field(default=600, ge=1)
    clip_max_new_tokens_estimation: int = Field(default=4096, ge=1)
    retract_decode_steps: int = Field(default=20, ge=1)
    decode_log_interval: int = Field(default=40, ge=1)
    output_len_mean: float | None = Field(default=None, gt=0.0)
    """When set, an answer that stops on EOS is about ``output_len_mean +
    output_len_per_prompt_token x prompt_len`` tokens, +- ``output_len_spread`` (uniform), instead
    of uniform over [1, max_new_tokens): a workload whose length a benchmark controls."""
    hide_load_routes: bool = False
    """``/v1/loads``, ``/get_load`` and ``/metrics`` answer 404 (a proxy that filters them):
    a server without any load signal."""
    output_len_spread: float = Field(default=0.25, ge=0.0, le=1.0)
    output_len_per_prompt_token: float = Field(default=0.0, ge=0.0)
    output_len_shape: Literal["uniform", "exponential"] = "uniform"
    """``uniform``: ``mean x (1 +- spread)``. ``exponential``: exponentially distributed around
    the mean (the spread is ignored), cut at ``max_new_tokens``: the long tail of thinking answers,
    where a few run many times the mean (the illustration of
    ``reference/sglang-quality-and-load.md`` section 4.2)."""

    # --- faults, decided per request from a seeded hash -------------------------------------------
    fail_500_rate: Rate = 0.0
    fail_503_rate: Rate = 0.0
    reset_rate: Rate = 0.0
    stall_rate: Rate = 0.0
    stall_s: float = Field(default=30.0, ge=0.0)
    abort_rate: Rate = 0.0
    bad_count_rate: Rate = 0.0
    stream_error_rate: Rate = 0.0

    # --- answer quality (simserver/answers.py), decided per answer from its own hash ----------
    empty_rate: Rate = 0.0
    """Share of answers that are the stop token alone."""
    loop_rate: Rate = 0.0
    """Share of answers that fall into a loop and repeat it until ``max_new_tokens``."""

    # --- logprobs and silent degradation (simserver/logprobs.py) -------------------------------
    logprobs_supported: bool = True
    """False: ``return_logprob`` is ignored (no logprob fields), as by a server or proxy that
    drops them."""
    logprob_noise: float = Field(default=0.01, ge=0.0)
    """bf16 batch noise: SD of every logit, per request, in nats."""
    routing_flip_rate: Rate = 0.0
    """Share of positions whose logits all move by N(0, 0.4): MoE near-ties routed elsewhere."""
    degraded: bool = False
    """Silent degradation: every dtype report stays bf16, but tokens that read pooled KV score
    lower and decode produces other tokens (an fp8 or corrupted cache, a bad kernel)."""
    degraded_dp_ranks: list[int] = Field(default_factory=list)
    """The same, on these DP ranks only (a fault in one rank's kernels or memory; ``degraded``
    is every rank)."""
    degrade_shift: float = Field(default=0.05, ge=0.0)
    degrade_sigma: float = Field(default=0.05, ge=0.0)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.enable_dp_attention and (self.dp_size < 2 or self.tp_size % self.dp_size):
            raise ValueError("enable_dp_attention needs dp_size > 1 and tp_size % dp_size == 0")
        if any(not 0 <= rank < self.dp_size for rank in self.degraded_dp_ranks):
            raise ValueError(f"degraded_dp_ranks must be DP ranks in [0, {self.dp_size})")
        eos, vocab = self.eos_token_id, self.vocab_size
        if eos is not None and vocab is not None and eos >= vocab:
            raise ValueError("eos_token_id must be < vocab_size")
        return self

    # --- derived ------------------------------------------------------------------------------

    def degraded_on(self, rank: int) -> bool:
        """Is a request on this DP rank silently degraded?"""
        return self.degraded or rank in self.degraded_dp_ranks

    def effective_kv_dtype(self) -> str:
        """The KV dtype the scheduler really uses (``internal_states[i].kv_cache_dtype``)."""
        if self.internal_kv_cache_dtype is not None:
            return self.internal_kv_cache_dtype
        return "bf16" if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    def is_fp8(self) -> bool:
        return self.effective_kv_dtype().startswith("fp8")

    def bytes_per_token(self) -> int:
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        internal = self.effective_kv_dtype()
        if internal.startswith("fp8"):
            return BF16_BYTES_PER_TOKEN // 2
        if internal.startswith("fp4"):
            return BF16_BYTES_PER_TOKEN // 4
        return BF16_BYTES_PER_TOKEN

    def max_req_input_len(self) -> int:
        return min(self.context_length - 1, self.max_total_num_tokens - 1) - 5

    def running_limit_per_rank(self) -> int:
        """``effective_max_running_requests_per_dp``: SGLang's default when not set."""
        pool = self.max_total_num_tokens
        if self.max_running_requests is None:
            derived = min(max(int(pool / self.context_length * 512), 2048), 4096)
            return max(1, min(derived, pool // 2))
        if self.enable_dp_attention:
            return max(1, self.max_running_requests // self.dp_size)
        return self.max_running_requests

    def served_name(self) -> str:
        return self.served_model_name or self.model_path

    def reported_tokenizer_path(self) -> str:
        return self.tokenizer_path or self.model_path

    def reported_chunked_prefill(self) -> int:
        if self.enable_dp_attention and self.chunked_prefill_size > 0:
            return self.chunked_prefill_size // self.dp_size
        return self.chunked_prefill_size

    def version_tuple(self) -> tuple[int, ...]:
        parts = []
        for piece in self.version.split("."):
            digits = "".join(ch for ch in piece if ch.isdigit())
            parts.append(int(digits or 0))
        return tuple(parts)

    def any_fault(self) -> bool:
        return (
            self.fail_500_rate
            + self.fail_503_rate
            + self.reset_rate
            + self.stall_rate
            + self.abort_rate
            + self.bad_count_rate
            + self.stream_error_rate
        ) > 0.0


# --- the model as far as token ids go ---------------------------------------------------------

TABLE_SIZE = 1 << 16
"""Generated ids are slices of a fixed pseudo-random table of valid ids: no per-token work."""
LOWEST_GENERATED_ID = 10
_EOS_NAMES = ("<|im_end|>", "<|endoftext|>", "[EOS]", "</s>", "<|eot_id|>", "<eos>")


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """Vocabulary facts the generator needs, resolved once per (tokenizer, vocab, eos)."""

    vocab_size: int
    eos_token_id: int
    excluded: frozenset[int]
    """Never generated: ids below LOWEST_GENERATED_ID, added/special tokens and the EOS."""
    table: list[int]
    tokenizer: Any | None = field(default=None, repr=False)
    word_starts: list[int] | None = field(default=None, repr=False)
    """Table positions where a word begins (text tables only), sorted: an answer starts at
    one, so it does not begin with half a word no tokenizer would produce alone."""

    def snap(self, offset: int) -> int:
        """The first word start at or after ``offset`` (wrapping), or ``offset`` itself."""
        starts = self.word_starts
        if not starts:
            return offset
        index = bisect.bisect_left(starts, offset)
        return starts[index] if index < len(starts) else starts[0]

    def snap_back(self, end: int) -> int:
        """The last word start at or before ``end``, or ``end`` itself."""
        starts = self.word_starts
        if not starts:
            return end
        index = bisect.bisect_right(starts, end)
        return starts[index - 1] if index else end

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text).ids)
        span = self.vocab_size - LOWEST_GENERATED_ID
        return [LOWEST_GENERATED_ID + byte % span for byte in text.encode()]

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is not None:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return " ".join(map(str, ids))


_MODELS: dict[tuple[str | None, int | None, int | None], ModelSpec] = {}


def resolve_model(config: SimConfig) -> ModelSpec:
    key = (config.tokenizer_path, config.vocab_size, config.eos_token_id)
    spec = _MODELS.get(key)
    if spec is None:
        spec = _MODELS[key] = _build_model(*key)
    return spec


def _build_model(path: str | None, vocab: int | None, eos: int | None) -> ModelSpec:
    tokenizer: Any | None = None
    specials: set[int] = set()
    if path is not None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        except Exception as exc:
            raise ConfigError(f"sim-server: cannot load {path}/tokenizer.json: {exc}") from exc
        specials = set(tokenizer.get_added_tokens_decoder())
        if vocab is None:
            vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))
        if eos is None:
            eos = _find_eos(Path(path), tokenizer)
    vocab = DEFAULT_VOCAB_SIZE if vocab is None else vocab
    eos = (
        (DEFAULT_EOS_TOKEN_ID if vocab > DEFAULT_EOS_TOKEN_ID else vocab - 1)
        if eos is None
        else eos
    )
    excluded = frozenset(specials | {eos} | set(range(LOWEST_GENERATED_ID)))
    allowed = [i for i in range(vocab) if i not in excluded]
    if not allowed:
        raise ConfigError("sim-server: the vocabulary has no ordinary token to generate")
    table = random.Random(0x5EED).choices(allowed, k=TABLE_SIZE)
    starts: list[int] | None = None
    if tokenizer is not None:
        text_table = _text_table(tokenizer, excluded)
        if text_table:
            table = text_table
            pieces = tokenizer.decode_batch([[t] for t in sorted(set(table))])
            opens = {
                t for t, text in zip(sorted(set(table)), pieces, strict=True) if text[:1].isspace()
            }
            starts = [i for i, t in enumerate(table) if t in opens]
    return ModelSpec(vocab, eos, excluded, table, tokenizer, starts)


def _text_table(tokenizer: Any, excluded: frozenset[int]) -> list[int]:
    """With a real tokenizer, the table is the canonical encoding of prose (the bundled sample
    conversations, shuffled and repeated): answers then decode to text and mostly survive a
    decode/encode round trip, as a real model's do; a table of random ids never would."""
    from importlib import resources

    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str) and len(value) > 20:
            texts.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    samples = resources.files("eagledata").joinpath("assets", "samples")
    for name in ("sharegpt.jsonl", "ultrachat.jsonl", "prompts.jsonl"):
        source = samples.joinpath(name)
        if source.is_file():
            for line in source.read_text(encoding="utf-8").splitlines():
                walk(json.loads(line))
    if not texts:
        return []
    shuffler = random.Random(0x7E47)
    table: list[int] = []
    while len(table) < TABLE_SIZE:
        shuffler.shuffle(texts)
        ids = tokenizer.encode("\n\n".join(texts), add_special_tokens=False).ids
        table.extend(t for t in ids if t not in excluded)
        table.append(tokenizer.encode("\n\n", add_special_tokens=False).ids[0])
    return table[:TABLE_SIZE]


def _find_eos(path: Path, tokenizer: Any) -> int:
    for name, key in (
        ("tokenizer_config.json", "eos_token"),
        ("generation_config.json", "eos_token_id"),
        ("config.json", "eos_token_id"),
    ):
        try:
            value = json.loads((path / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str):
            value = tokenizer.token_to_id(value)
        if isinstance(value, int):
            return value
    for name in _EOS_NAMES:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    raise ConfigError(f"sim-server: no EOS token found in {path}; set eos_token_id")


# --- what the server reports about itself -------------------------------------------------------


def server_info(
    config: SimConfig,
    *,
    host: str,
    port: int,
    throughput: float,
    spec_tokens: int = 0,
    spec_verify_ct: int = 0,
) -> dict[str, Any]:
    """``/server_info``: flat ServerArgs keys, rank-0 scheduler info, internal_states, version."""
    pool, bpt = config.max_total_num_tokens, config.bytes_per_token()
    args: dict[str, Any] = {
        "model_path": config.model_path,
        "tokenizer_path": config.reported_tokenizer_path(),
        "served_model_name": config.served_name(),
        "dtype": config.dtype,
        "kv_cache_dtype": config.kv_cache_dtype,
        "quantization": config.quantization,
        "tp_size": config.tp_size,
        "pp_size": 1,
        "dp_size": config.dp_size,
        "enable_dp_attention": config.enable_dp_attention,
        "mem_fraction_static": config.mem_fraction_static,
        "max_total_tokens": None,
        "max_running_requests": config.max_running_requests,
        "max_queued_requests": config.max_queued_requests,
        "chunked_prefill_size": config.reported_chunked_prefill(),
        "cuda_graph_max_bs": 512,
        "context_length": config.context_length,
        "page_size": 1,
        "schedule_policy": "fcfs",
        "disable_radix_cache": config.disable_radix_cache,
        "enable_hierarchical_cache": config.enable_hierarchical_cache,
        "hicache_ratio": 2.0,
        "hicache_size": 0,
        "hicache_storage_backend": None,
        "enable_metrics": config.enable_metrics,
        "host": host,
        "port": port,
        "attention_backend": None,
        "skip_tokenizer_init": config.skip_tokenizer_init,
        "stream_output": False,
        "stream_interval": 1,
        "trust_remote_code": True,
        **spec_sim.server_args(config.speculative),
    }
    internal = {
        **args,
        "kv_cache_dtype": config.effective_kv_dtype(),
        "last_gen_throughput": throughput,
        "memory_usage": {
            "weight": round(71.6 * 8 / config.tp_size, 2),
            "kvcache": pool * bpt / 2**30,
            "token_capacity": pool,
            "graph": 2.1,
        },
        "effective_max_running_requests_per_dp": config.running_limit_per_rank(),
        **spec_sim.internal_state(
            config.speculative,
            requested_kv_dtype=config.kv_cache_dtype,
            tokens=spec_tokens,
            verify_ct=spec_verify_ct,
        ),
    }
    return {
        **args,
        "status": "ready",
        "max_total_num_tokens": pool,
        "max_req_input_len": config.max_req_input_len(),
        "internal_states": [dict(internal, dp_rank=i) for i in range(config.dp_size)],
        "version": config.version,
    }


def model_info(config: SimConfig) -> dict[str, Any]:
    return {
        "model_path": config.model_path,
        "tokenizer_path": config.reported_tokenizer_path(),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": config.model_type == "kimi_k25",
        "has_audio_understanding": False,
        "model_type": config.model_type,
        "architectures": config.architectures,
    }
