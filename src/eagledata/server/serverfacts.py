"""What a running SGLang server says about itself, and the bf16-KV guard verdict on it.

``ServerFacts`` is parsed from the body of ``GET /server_info`` (``/get_server_info`` on older
servers): every ServerArgs field flat at the top level, rank 0's scheduler info, and
``internal_states`` (one entry per attention-DP rank, each with the scheduler's own args and
``memory_usage``). Missing keys become ``None``; a wrong type for a key the guard reads is a
refusal, never a silent ``None``.

The guard (DESIGN invariant 2) trusts no single field, because SGLang resolves
``--kv-cache-dtype auto`` to fp8 for checkpoints that declare an fp8 KV cache and says so only in
``internal_states[i].kv_cache_dtype``:

* the requested top-level ``kv_cache_dtype`` must be bf16 (``auto`` is tolerated only when every
  internal state reports bf16);
* every ``internal_states[i].kv_cache_dtype`` must be bf16;
* where the server reports memory, ``kvcache GiB * 2**30 / token_capacity`` must be the model's
  bf16 bytes per token within 10 % (fp8 would be half);
* the served ``model_path`` must be the expected model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from eagledata.errors import ServerRefusedError
from eagledata.server.speculative import (
    SpeculativeSettings,
    format_speculative,
    settings_from_facts,
    speculative_guard,
)

BF16_NAMES = frozenset({"bf16", "bfloat16"})
BYTES_PER_TOKEN_TOLERANCE = 0.10
KVCACHE_ROUNDING_GIB = 0.005
"""SGLang rounds ``memory_usage.kvcache`` to 2 decimals (GiB)."""


def _none_if_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


Lenient = WrapValidator(_none_if_invalid)
"""For informational keys: a value of an unexpected type reads as unknown (``None``)."""


class _Facts(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MemoryUsage(_Facts):
    """``internal_states[i].memory_usage``: GiB figures and the KV pool size in tokens."""

    kvcache: StrictFloat | None = None
    token_capacity: StrictInt | None = None
    weight: Annotated[float | None, Lenient] = None
    graph: Annotated[float | None, Lenient] = None


class InternalState(_Facts):
    """One attention-DP rank's scheduler view."""

    kv_cache_dtype: StrictStr | None = None
    memory_usage: MemoryUsage | None = None
    effective_max_running_requests_per_dp: Annotated[int | None, Lenient] = None
    last_gen_throughput: Annotated[float | None, Lenient] = None
    # speculative decoding: the scheduler's run-time copy of the thresholds, and its acceptance
    speculative_accept_threshold_single: Annotated[float | None, Lenient] = None
    speculative_accept_threshold_acc: Annotated[float | None, Lenient] = None
    avg_spec_accept_length: Annotated[float | None, Lenient] = None

    @property
    def bytes_per_token(self) -> float | None:
        usage = self.memory_usage
        if usage is None or usage.kvcache is None or not usage.token_capacity:
            return None
        return usage.kvcache * 2**30 / usage.token_capacity


class ServerFacts(_Facts):
    """The parts of ``/server_info`` eagledata checks and shows."""

    kv_cache_dtype: StrictStr | None = None
    model_path: StrictStr | None = None
    served_model_name: Annotated[str | None, Lenient] = None
    version: Annotated[str | None, Lenient] = None
    dtype: Annotated[str | None, Lenient] = None
    tp_size: Annotated[int | None, Lenient] = None
    dp_size: Annotated[int | None, Lenient] = None
    dcp_size: Annotated[int | None, Lenient] = None
    enable_dp_attention: Annotated[bool | None, Lenient] = None
    enable_hierarchical_cache: Annotated[bool | None, Lenient] = None
    mem_fraction_static: Annotated[float | None, Lenient] = None
    max_running_requests: Annotated[int | None, Lenient] = None
    max_queued_requests: Annotated[int | None, Lenient] = None
    """``--max-queued-requests``: a DP rank's waiting queue past it answers 503 (None: no cap)."""
    chunked_prefill_size: Annotated[int | None, Lenient] = None
    max_total_num_tokens: Annotated[int | None, Lenient] = None
    max_req_input_len: Annotated[int | None, Lenient] = None
    context_length: Annotated[int | None, Lenient] = None
    internal_states: list[InternalState] | None = None
    # speculative decoding (ServerArgs fields; server/speculative.py reads them)
    speculative_algorithm: Annotated[str | None, Lenient] = None
    speculative_draft_model_path: Annotated[str | None, Lenient] = None
    speculative_num_steps: Annotated[int | None, Lenient] = None
    speculative_eagle_topk: Annotated[int | None, Lenient] = None
    speculative_num_draft_tokens: Annotated[int | None, Lenient] = None
    speculative_accept_threshold_single: Annotated[float | None, Lenient] = None
    speculative_accept_threshold_acc: Annotated[float | None, Lenient] = None

    @property
    def speculative(self) -> SpeculativeSettings | None:
        """Speculative decoding settings and measured acceptance; None when it is off."""
        return settings_from_facts(
            algorithm=self.speculative_algorithm,
            draft_model_path=self.speculative_draft_model_path,
            num_steps=self.speculative_num_steps,
            eagle_topk=self.speculative_eagle_topk,
            num_draft_tokens=self.speculative_num_draft_tokens,
            accept_threshold_single=self.speculative_accept_threshold_single,
            accept_threshold_acc=self.speculative_accept_threshold_acc,
            rank_accept_lengths=[s.avg_spec_accept_length for s in self.internal_states or []],
        )

    @classmethod
    def from_server_info(cls, body: object) -> ServerFacts:
        """Parse a ``/server_info`` JSON body; a malformed one is a refusal."""
        if not isinstance(body, Mapping):
            raise ServerRefusedError(
                f"server_info: expected a JSON object, got {type(body).__name__}"
            )
        try:
            return cls.model_validate(dict(body))
        except ValidationError as error:
            first = error.errors()[0]
            loc = ".".join(str(part) for part in first["loc"])
            more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
            raise ServerRefusedError(f"server_info: {loc}: {first['msg']}{more}") from None

    @property
    def dp_ranks(self) -> int:
        """The DP ranks (attention ranks or replicas) a request can be pinned to with
        ``data_parallel_rank``: each has its own scheduler and radix cache."""
        return max(1, self.dp_size or 1)

    @property
    def system_kv_tokens(self) -> int | None:
        """KV slots of the whole server: DP attention ranks add up, DCP multiplies each."""
        per_rank = self.max_total_num_tokens
        states = self.internal_states or []
        capacities = [
            s.memory_usage.token_capacity
            for s in states
            if s.memory_usage is not None and s.memory_usage.token_capacity is not None
        ]
        if self.enable_dp_attention and capacities and len(capacities) == len(states):
            total = sum(capacities)
        elif per_rank is None:
            return None
        elif self.enable_dp_attention:
            total = per_rank * (self.dp_size or 1)
        else:
            total = per_rank
        return total * (self.dcp_size or 1)


class GuardVerdict(BaseModel):
    """The bf16-KV guard's answer. ``problems`` refuse the server; ``notes`` only inform."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    problems: list[str]
    notes: list[str] = []
    requested_kv_dtype: str | None = None
    kv_dtypes: list[str]
    """``internal_states[i].kv_cache_dtype`` in rank order (``"?"`` when a rank omits it)."""
    bytes_per_token: float | None = None
    expected_bytes_per_token: int | None = None

    def summary(self) -> str:
        """One line: the verdict and its reasons."""
        if not self.ok:
            return "REFUSED: " + "; ".join(self.problems)
        dtypes = _group_dtypes(self.kv_dtypes) or "no internal_states"
        text = f"bf16 KV ok: kv_cache_dtype={self.requested_kv_dtype!r}, ranks {dtypes}"
        if self.bytes_per_token is not None:
            text += f", {self.bytes_per_token:,.0f} B/token"
        return text

    def raise_if_refused(self) -> None:
        """Raise ``ServerRefusedError`` naming the problems and the fix."""
        if not self.ok:
            raise ServerRefusedError(
                "server refused, nothing it generates may land: "
                + "; ".join(self.problems)
                + " (relaunch with --kv-cache-dtype bf16: eagledata launch-server)"
            )


def _is_bf16(dtype: str | None) -> bool:
    return dtype is not None and dtype.lower() in BF16_NAMES


def _group_dtypes(dtypes: list[str]) -> str:
    """``['bf16', 'bf16', 'fp8_e4m3']`` -> ``bf16 x2, fp8_e4m3 x1`` (first-seen order)."""
    counts: dict[str, int] = {}
    for dtype in dtypes:
        counts[dtype] = counts.get(dtype, 0) + 1
    return ", ".join(f"{dtype} x{n}" for dtype, n in counts.items())


def _ranks(indices: list[int]) -> str:
    if len(indices) == 1:
        return f"internal_states[{indices[0]}]"
    return "internal_states[" + ",".join(str(i) for i in indices) + "]"


def evaluate_kv_guard(
    facts: ServerFacts,
    *,
    expected_model: str | None,
    bf16_bytes_per_token: int | None,
    tolerance: float = BYTES_PER_TOKEN_TOLERANCE,
) -> GuardVerdict:
    """Judge whether ``facts`` describe a server with a bf16 KV cache serving the right model."""
    problems: list[str] = []
    notes: list[str] = []
    requested = facts.kv_cache_dtype
    states = facts.internal_states or []

    if requested is None:
        problems.append("server_info has no kv_cache_dtype")
    elif requested != "auto" and not _is_bf16(requested):
        problems.append(f"kv_cache_dtype is {requested!r}, not bf16")

    # internal states: group the ranks that report the same non-bf16 dtype
    kv_dtypes = [s.kv_cache_dtype if s.kv_cache_dtype is not None else "?" for s in states]
    bad: dict[str, list[int]] = {}
    for index, dtype in enumerate(kv_dtypes):
        if not _is_bf16(dtype):
            bad.setdefault(dtype, []).append(index)
    for dtype, indices in bad.items():
        where = _ranks(indices)
        if dtype == "?":
            verb = "reports" if len(indices) == 1 else "report"
            problems.append(f"{where} {verb} no kv_cache_dtype")
        elif requested == "auto":
            verb = "left it unresolved as" if dtype == "auto" else "resolved it to"
            problems.append(f"kv_cache_dtype is 'auto' and {where} {verb} {dtype!r}")
        elif dtype != requested:
            problems.append(f"{where}.kv_cache_dtype is {dtype!r}, not bf16")
    if not states:
        if requested == "auto":
            problems.append(
                "kv_cache_dtype is 'auto' and server_info has no internal_states to show "
                "what it resolved to"
            )
        elif _is_bf16(requested):
            notes.append("no internal_states: resolved KV dtype and bytes per token not checked")

    # bytes per KV token, rank by rank
    measured: float | None = None
    if bf16_bytes_per_token is None:
        notes.append("bytes per KV token not compared (the model's bf16 figure is unknown)")
    mismatched: dict[str, list[int]] = {}
    for index, state in enumerate(states):
        value = state.bytes_per_token
        if value is None:
            continue
        measured = value if measured is None else measured
        if bf16_bytes_per_token is None:
            continue
        kvcache = state.memory_usage.kvcache if state.memory_usage else None
        if kvcache is not None and KVCACHE_ROUNDING_GIB / kvcache > tolerance / 2:
            notes.append(f"{_ranks([index])}: KV pool of {kvcache} GiB too small to measure")
            continue
        if abs(value / bf16_bytes_per_token - 1) > tolerance:
            mismatched.setdefault(f"{value:,.0f}", []).append(index)
    if states and measured is None:
        notes.append("no memory_usage in internal_states: bytes per token not checked")
    for value_text, indices in mismatched.items():
        assert bf16_bytes_per_token is not None
        verb = "holds" if len(indices) == 1 else "hold"
        problems.append(
            f"{_ranks(indices)} {verb} {value_text} B per KV token, bf16 is "
            f"{bf16_bytes_per_token:,} (fp8 would be {bf16_bytes_per_token // 2:,})"
        )

    speculative = facts.speculative
    if speculative is not None:
        spec_problems, spec_notes = speculative_guard(
            speculative,
            requested_kv_dtype=requested,
            rank_thresholds=[
                (s.speculative_accept_threshold_single, s.speculative_accept_threshold_acc)
                for s in states
            ],
        )
        problems += spec_problems
        notes += spec_notes

    if expected_model is not None:
        served = facts.model_path
        if served is None:
            problems.append(f"server_info has no model_path (expected {expected_model!r})")
        elif served.rstrip("/") != expected_model.rstrip("/"):
            problems.append(f"server serves {served!r}, expected {expected_model!r}")

    return GuardVerdict(
        ok=not problems,
        problems=problems,
        notes=notes,
        requested_kv_dtype=requested,
        kv_dtypes=kv_dtypes,
        bytes_per_token=measured,
        expected_bytes_per_token=bf16_bytes_per_token,
    )


def _fmt(value: object, formatter: Callable[[Any], str] = str) -> str:
    return "unknown" if value is None else formatter(value)


def _on_off(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "off")


def format_facts(facts: ServerFacts, verdict: GuardVerdict) -> str:
    """The ``check-server`` report: one fact a line, the verdict last."""

    def num(value: Any) -> str:
        return f"{value:,}"

    kv_tokens = _fmt(facts.max_total_num_tokens, num) + " per rank"
    system = facts.system_kv_tokens
    if system is not None and system != facts.max_total_num_tokens:
        kv_tokens += f", {system:,} for the server"
    if facts.dcp_size and facts.dcp_size > 1:
        kv_tokens += f" (DCP {facts.dcp_size})"

    ranks = _group_dtypes(verdict.kv_dtypes) or "none reported"
    per_dp = [
        s.effective_max_running_requests_per_dp
        for s in facts.internal_states or []
        if s.effective_max_running_requests_per_dp is not None
    ]
    running = "default" if facts.max_running_requests is None else f"{facts.max_running_requests:,}"
    if per_dp:
        running += f" (effective per DP rank: {per_dp[0]:,})"

    bpt = _fmt(verdict.bytes_per_token, lambda v: f"{v:,.0f}")
    if verdict.expected_bytes_per_token is not None:
        bpt += f" (bf16 expects {verdict.expected_bytes_per_token:,})"

    model = _fmt(facts.model_path)
    if facts.served_model_name and facts.served_model_name != facts.model_path:
        model += f" (served as {facts.served_model_name})"

    rows = [
        ("model", model),
        ("sglang version", _fmt(facts.version)),
        ("model dtype", _fmt(facts.dtype)),
        ("KV cache dtype", f"requested {_fmt(facts.kv_cache_dtype)}; ranks: {ranks}"),
        ("KV tokens", kv_tokens),
        (
            "parallelism",
            f"TP {_fmt(facts.tp_size)}, DP {_fmt(facts.dp_size)}, "
            f"DP attention {_on_off(facts.enable_dp_attention)}"
            + (f", DCP {facts.dcp_size}" if facts.dcp_size else ""),
        ),
        ("hierarchical cache", _on_off(facts.enable_hierarchical_cache)),
        ("mem fraction static", _fmt(facts.mem_fraction_static)),
        ("max running requests", running),
        (
            "context length",
            _fmt(facts.context_length, num)
            + (
                f" (max input {facts.max_req_input_len:,})"
                if facts.max_req_input_len is not None
                else ""
            ),
        ),
        ("bytes per KV token", bpt),
        ("speculative decoding", format_speculative(facts.speculative)),
        ("verdict", verdict.summary()),
    ]
    rows += [("note", note) for note in verdict.notes]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)
