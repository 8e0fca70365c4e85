"""Settings of the simulated SGLang server, and the facts derived from them.

Every field can be changed at runtime through ``POST /_sim/control`` (the app re-validates the
merged settings), so derived values are methods, never cached copies.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eagledata.simserver.speculative import SimSpeculative

BF16_BYTES_PER_TOKEN = 70_272
"""Kimi-K2.5 / DeepSeek-V3 MLA latent: (512 + 64) values x 61 layers x 2 bytes, per GPU."""

DEFAULT_VOCAB_SIZE = 163_840
DEFAULT_EOS_TOKEN_ID = 163_586

Rate = Annotated[float, Field(ge=0.0, le=1.0)]


class SGLangLoopSettings(BaseModel):
    """The step-time fit of the second scheduler model (``engine="sglang-loop"``,
    ``simserver/sglang_loop.py``), and SGLang's ``--max-prefill-tokens``.

    A decode step of ``N`` requests holding ``T`` tokens lasts ``decode_base_s +
    decode_per_request_s N + decode_per_context_token_s T``: at the reference job's point (20
    requests, ~104,000 tokens) 0.0824 s, within 2% of the reference fit ``0.077 + 0.00018 N``,
    but a batch of short requests is cheaper than a batch of long ones (attention reads every
    token). A prefill lasts ``prefill_base_s`` plus its extend tokens at ``prefill_tok_per_s``
    (an assumption: not measured on the reference rig). ``slowdown`` multiplies both (a slower
    server)."""

    model_config = ConfigDict(extra="forbid")

    decode_base_s: float = Field(default=0.070, gt=0.0)
    decode_per_request_s: float = Field(default=0.0001, ge=0.0)
    decode_per_context_token_s: float = Field(default=1e-7, ge=0.0)
    prefill_base_s: float = Field(default=0.02, ge=0.0)
    prefill_tok_per_s: float = Field(default=12_000.0, gt=0.0)
    max_prefill_tokens: int = Field(default=16_384, ge=1)
    slowdown: float = Field(default=1.0, gt=0.0)


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
    """The SGLang release the server speaks (``sim-server --sglang-version``): its
    ``/server_info``, ``/v1/loads``, ``/metrics`` and ``/generate`` shapes follow it
    (``simserver/shapes.py``)."""

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
    dcp_size: int = Field(default=1, ge=1)
    """Decode context parallelism: each GPU holds 1/dcp_size of every request's KV (0.5.15+)."""
    mem_fraction_static: float = Field(default=0.85, gt=0.0, le=1.0)
    max_total_num_tokens: int = Field(default=116_000, gt=6)
    """KV pool of one DP rank, in tokens (under DCP, every DCP rank's share counted; each
    release reports it its own way, ``simserver/shapes.py``)."""
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
    stop_at_limit_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of the stopping answers whose stop token is their ``max_new_tokens``-th id: the
    release says ``stop`` or ``length`` for them (``finish_at_limit`` of its release file)."""
    seed: int = 0

    # --- the SGLang capacity engine (simserver/capacity.py; issue 9) ----------------------------
    engine: Literal["simple", "sglang", "sglang-loop"] = "simple"
    """``simple``: the latency/decode-speed model above. ``sglang``: a step-by-step model of
    SGLang's scheduler (KV pool filled as requests decode, admission with the decaying
    ``new_token_ratio``, retraction, batched step time); it ignores ``latency_s`` and
    ``decode_tok_per_s``. ``sglang-loop``: a second model of the same scheduler, written anew
    from SGLang's source (``simserver/sglang_loop.py``: its event loop, ``batch_is_full``,
    chunked prefill, 503 for a retracted request on a full queue), with a step-time fit of its
    own (``sglang_loop``)."""
    sglang_loop: SGLangLoopSettings = Field(default_factory=SGLangLoopSettings)
    step_base_s: float = Field(default=0.077, gt=0.0)
    step_per_request_s: float = Field(default=0.00018, ge=0.0)
    """Decode step time = base + per_request x running: tok/s = N / (0.077 + 0.00018 N), the
    reference fit (docs/capacity.md, "The step-time fit")."""
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
    metrics_only: bool = False
    """``/v1/loads`` and ``/get_load`` answer 404, ``/metrics`` stays: a server whose only load
    signal is Prometheus."""
    metrics_dp_labels: bool = True
    """False: ``/metrics`` carries no ``dp_rank`` label, so each gauge is one series. SGLang's
    scheduler gauges are ``multiprocess_mode="mostrecent"``: with one label set for every DP
    rank's process, a scrape reads whichever rank wrote last (here: each rank in turn)."""
    output_len_spread: float = Field(default=0.25, ge=0.0, le=1.0)
    output_len_per_prompt_token: float = Field(default=0.0, ge=0.0)
    output_len_shape: Literal["uniform", "exponential"] = "uniform"
    """``uniform``: ``mean x (1 +- spread)``. ``exponential``: exponentially distributed around
    the mean (the spread is ignored), cut at ``max_new_tokens``: the long tail of thinking answers,
    where a few run many times the mean (``docs/throughput.md``, "The benchmark": exponential
    answers)."""
    output_len_long_token: int | None = Field(default=None, ge=0)
    output_len_long_mean: float | None = Field(default=None, gt=0.0)
    """A prompt that holds the token id ``output_len_long_token`` has answers of about
    ``output_len_long_mean`` instead of ``output_len_mean`` (same spread and shape): a growth
    that belongs to the work item, whenever its request arrives (``bench_matrix.py``'s
    ``growing``: the second half of the dataset carries the token)."""

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
    think_share: Rate = 0.0
    """A thinking model: this share of an answer's ids is thinking, in a think block
    (``<think>`` ... ``</think>``, then the answer) when the tokenizer has think tags; the
    opening tag is left out when the prompt opened the block itself (the generation prompt of a
    thinking template). An answer cut at ``max_new_tokens`` is cut inside its thinking."""

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
    degrade_after_generations: int | None = Field(default=None, ge=0)
    """A silent degradation that starts by itself: once the server has taken this many
    generations (requests for at least one new token; prefill-only scorings do not count),
    every later request is answered as ``degraded`` would (reporting bf16 all along)."""
    degrade_shift: float = Field(default=0.05, ge=0.0)
    degrade_sigma: float = Field(default=0.05, ge=0.0)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.enable_dp_attention and (self.dp_size < 2 or self.tp_size % self.dp_size):
            raise ValueError("enable_dp_attention needs dp_size > 1 and tp_size % dp_size == 0")
        if self.tp_size % self.dcp_size:
            raise ValueError("dcp_size must divide tp_size")
        if any(not 0 <= rank < self.dp_size for rank in self.degraded_dp_ranks):
            raise ValueError(f"degraded_dp_ranks must be DP ranks in [0, {self.dp_size})")
        eos, vocab = self.eos_token_id, self.vocab_size
        if eos is not None and vocab is not None and eos >= vocab:
            raise ValueError("eos_token_id must be < vocab_size")
        return self

    # --- derived ------------------------------------------------------------------------------

    def degraded_on(self, rank: int, generations: int = 0) -> bool:
        """Is a request on this DP rank silently degraded, ``generations`` taken before it?"""
        after = self.degrade_after_generations
        return (
            self.degraded
            or rank in self.degraded_dp_ranks
            or (after is not None and generations >= after)
        )

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

    @property
    def steps_engine(self) -> bool:
        """True when a step-by-step scheduler model runs the server (not ``simple``)."""
        return self.engine != "simple"

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
