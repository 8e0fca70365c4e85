"""What a running SGLang server says about itself, and the bf16-KV guard verdict on it.

``ServerFacts`` is parsed from the body of ``GET /server_info`` (``/get_server_info`` on older
servers): every ServerArgs field flat at the top level, rank 0's scheduler info, and
``internal_states`` (one entry per attention-DP rank, each with the scheduler's own args and
``memory_usage``). Missing keys become ``None``; a wrong type for a key the guard reads is a
refusal, never a silent ``None``.

The guard (bf16 KV or nothing, docs/sglang.md) trusts no single field, because SGLang resolves
``--kv-cache-dtype auto`` to fp8 for checkpoints that declare an fp8 KV cache and says so only in
``internal_states[i].kv_cache_dtype``:

* the requested top-level ``kv_cache_dtype`` must be bf16 (``auto`` is tolerated only when every
  internal state reports bf16);
* every ``internal_states[i].kv_cache_dtype`` must be bf16;
* where the server reports memory, ``kvcache GiB * 2**30 / token_capacity`` must be the model's
  bf16 bytes per token within 10 % (fp8 would be half); under DCP, ``token_capacity`` is one
  rank's rows in 0.5.15.post1 and every DCP rank's share in 0.5.23 while ``kvcache`` stays one
  rank's GiB, so the rows are taken as the server's release reports them;
* a draft model's own KV dtype (``speculative_draft_kv_cache_dtype``, 0.5.23) must be unset
  (it follows the target's) or bf16;
* the served ``model_path`` must be the expected model.

How a release reports DP attention, DCP capacity and the rank pin comes from its file in
``configs/sglang-releases/`` (``profiles/releases.py``), chosen by the ``version`` the server
states. A version this eagledata does not know is read as the newest known release below it,
said once (``release_note``), and every check that depends on what changed is skipped, never
guessed.
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
from pydantic.functional_validators import BeforeValidator

from eagledata.errors import ServerRefusedError
from eagledata.profiles.releases import Release, release_for, supported_versions
from eagledata.server.speculative import (
    SpeculativeSettings,
    format_speculative,
    settings_from_facts,
    speculative_guard,
)

BF16_NAMES = frozenset({"bf16", "bfloat16"})
BYTES_PER_TOKEN_TOLERANCE = 0.10
KVCACHE_ROUNDING_GIB = 0.005
"""SGLang rounds ``memory_usage.kvcache`` to 2 decimals (GiB) up to 0.5.15.post1, 3 in 0.5.23."""
BOTH_PIN_FIELDS = ("routed_dp_rank", "data_parallel_rank")
"""The rank pin for a release eagledata does not know: 0.5.9 drops routed_dp_rank, 0.5.15.post1
drops data_parallel_rank, 0.5.23 takes either (tests/test_sglang_releases.py)."""


def _none_if_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


Lenient = WrapValidator(_none_if_invalid)
"""For informational keys: a value of an unexpected type reads as unknown (``None``)."""


class _Facts(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _graph_gib(value: Any) -> Any:
    """``memory_usage.graph``: a number up to 0.5.15.post1, ``{phase: GiB}`` in 0.5.23."""
    if isinstance(value, Mapping):
        parts = [v for v in value.values() if isinstance(v, int | float)]
        return float(sum(parts)) if parts else None
    return value


class MemoryUsage(_Facts):
    """``internal_states[i].memory_usage``: GiB figures and the KV pool size in tokens."""

    kvcache: StrictFloat | None = None
    token_capacity: StrictInt | None = None
    weight: Annotated[float | None, Lenient] = None
    graph: Annotated[float | None, BeforeValidator(_graph_gib), Lenient] = None


class InternalState(_Facts):
    """One attention-DP rank's scheduler view."""

    kv_cache_dtype: StrictStr | None = None
    memory_usage: MemoryUsage | None = None
    effective_max_running_requests_per_dp: Annotated[int | None, Lenient] = None
    last_gen_throughput: Annotated[float | None, Lenient] = None
    # speculative decoding: the scheduler's run-time copy of the thresholds, and its acceptance
    speculative_accept_threshold_single: Annotated[float | None, Lenient] = None
    speculative_accept_threshold_acc: Annotated[float | None, Lenient] = None
    speculative_draft_kv_cache_dtype: Annotated[str | None, Lenient] = None
    avg_spec_accept_length: Annotated[float | None, Lenient] = None

    def bytes_per_token(self, row_divisor: int = 1) -> float | None:
        """KV bytes one token takes on one rank: ``kvcache`` (one rank's GiB) over the rows it
        holds, ``token_capacity / row_divisor`` (``ServerFacts.row_divisor``)."""
        usage = self.memory_usage
        if usage is None or usage.kvcache is None or not usage.token_capacity:
            return None
        return usage.kvcache * 2**30 * row_divisor / usage.token_capacity


class ServerFacts(_Facts):
    """The parts of ``/server_info`` eagledata checks and shows."""

    kv_cache_dtype: StrictStr | None = None
    model_path: StrictStr | None = None
    served_model_name: Annotated[str | None, Lenient] = None
    version: Annotated[str | None, Lenient] = None
    dtype: Annotated[str | None, Lenient] = None
    tp_size: Annotated[int | None, Lenient] = None
    nnodes: Annotated[int | None, Lenient] = None
    """The nodes the server spans (its ``--nnodes``); only node rank 0 answers HTTP."""
    dp_size: Annotated[int | None, Lenient] = None
    attn_dp_size: Annotated[int | None, Lenient] = None
    """0.5.23: the attention-DP width (``dp_size`` then counts replicas: 1 under DP attention)."""
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
    speculative_draft_kv_cache_dtype: Annotated[str | None, Lenient] = None
    """0.5.23: the draft model's own KV dtype; None follows ``kv_cache_dtype``."""

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

    # --- read as the server's release reports it ------------------------------------------

    @property
    def release(self) -> Release:
        """The release whose reporting this server's facts are read by (``release_for``)."""
        return release_for(self.version)[0]

    @property
    def release_known(self) -> bool:
        """Does this eagledata know the server's SGLang release?"""
        return release_for(self.version)[1]

    @property
    def release_note(self) -> str | None:
        """One line when the server runs a release this eagledata does not know; else None."""
        if self.release_known:
            return None
        known = ", ".join(supported_versions())
        stated = f"sglang {self.version}" if self.version else "a server that states no version"
        return (
            f"{stated} is not a release this eagledata knows ({known}): read as "
            f"{self.release.version}; checks that depend on what changed since are skipped"
        )

    @property
    def attention_dp(self) -> bool:
        """DP attention: ``enable_dp_attention`` (0.5.9, 0.5.15.post1; 0.5.23 recomputes it) or an
        ``attn_dp_size`` above 1 (0.5.23)."""
        return bool(self.enable_dp_attention) or (self.attn_dp_size or 1) > 1

    @property
    def dp_ranks(self) -> int:
        """The DP ranks (attention ranks or replicas) a request can be pinned to: each has its
        own scheduler and radix cache. 0.5.23 counts ``dp_size`` replicas of ``attn_dp_size``
        attention ranks (``runtime_context.num_dp_ranks_of``); earlier releases put the
        attention-DP width in ``dp_size``."""
        return max(1, self.dp_size or 1) * max(1, self.attn_dp_size or 1)

    @property
    def rank_pin_fields(self) -> tuple[str, ...]:
        """The ``/generate`` field(s) that pin a DP rank on this server: the one its release
        knows, both for a release this eagledata does not know (each known release ignores or
        aliases the other)."""
        if not self.release_known:
            return BOTH_PIN_FIELDS
        return (self.release.server.rank_pin,)

    @property
    def row_divisor(self) -> int | None:
        """What a reported token capacity is divided by to give the rows one rank holds (the
        DCP size when the release reports every DCP rank's share, else 1); None when unknown
        (a release this eagledata does not know, under DCP)."""
        dcp = max(1, self.dcp_size or 1)
        if dcp == 1:
            return 1
        if not self.release_known:
            return None
        return dcp if self.release.server.dcp_capacity == "logical" else 1

    @property
    def capacity_factor(self) -> int | None:
        """What a reported token capacity is multiplied by to count every DCP rank's share:
        the DCP size for a release reporting one rank's rows, 1 otherwise; None when unknown."""
        dcp = max(1, self.dcp_size or 1)
        if dcp == 1:
            return 1
        if not self.release_known:
            return None
        return 1 if self.release.server.dcp_capacity == "logical" else dcp

    @property
    def rank_kv_tokens(self) -> int | None:
        """KV tokens one DP rank's scheduler holds, every DCP rank's share counted."""
        factor = self.capacity_factor
        if self.max_total_num_tokens is None or factor is None:
            return None
        return self.max_total_num_tokens * factor

    @property
    def system_kv_tokens(self) -> int | None:
        """KV tokens of the whole server: DP attention ranks add up, each counting every DCP
        rank's share (0.5.23 reports them so; 0.5.15.post1 reports one rank's rows)."""
        factor = self.capacity_factor
        per_rank = self.max_total_num_tokens
        if factor is None:
            return None
        states = self.internal_states or []
        capacities = [
            s.memory_usage.token_capacity
            for s in states
            if s.memory_usage is not None and s.memory_usage.token_capacity is not None
        ]
        if self.attention_dp and capacities and len(capacities) == len(states):
            total = sum(capacities)
        elif per_rank is None:
            return None
        elif self.attention_dp:
            total = per_rank * self.dp_ranks
        else:
            total = per_rank
        return total * factor


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

    # bytes per KV token, rank by rank, over the rows one rank holds
    measured: float | None = None
    if bf16_bytes_per_token is None:
        notes.append("bytes per KV token not compared (the model's bf16 figure is unknown)")
    divisor = facts.row_divisor
    if divisor is None and states:
        notes.append(
            f"bytes per KV token not checked: how sglang {facts.version} reports token capacity "
            f"under DCP {facts.dcp_size} is unknown to this eagledata"
        )
    mismatched: dict[str, list[int]] = {}
    for index, state in enumerate(states):
        value = state.bytes_per_token(divisor) if divisor is not None else None
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
    if states and measured is None and divisor is not None:
        notes.append("no memory_usage in internal_states: bytes per token not checked")
    for value_text, indices in mismatched.items():
        assert bf16_bytes_per_token is not None
        verb = "holds" if len(indices) == 1 else "hold"
        problems.append(
            f"{_ranks(indices)} {verb} {value_text} B per KV token, bf16 is "
            f"{bf16_bytes_per_token:,} (fp8 would be {bf16_bytes_per_token // 2:,})"
        )

    # the draft model's own KV dtype (0.5.23); unset, it follows kv_cache_dtype
    draft = {"top level": facts.speculative_draft_kv_cache_dtype}
    draft |= {_ranks([i]): s.speculative_draft_kv_cache_dtype for i, s in enumerate(states)}
    bad_draft = {where: dtype for where, dtype in draft.items() if dtype and not _is_bf16(dtype)}
    for dtype in dict.fromkeys(bad_draft.values()):
        where = ", ".join(w for w, d in bad_draft.items() if d == dtype)
        problems.append(
            f"speculative_draft_kv_cache_dtype is {dtype!r} ({where}): the draft model's KV "
            "cache is not bf16"
        )

    if facts.release_note is not None:
        notes.append(facts.release_note)

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

    dcp = max(1, facts.dcp_size or 1)
    rank_tokens = facts.rank_kv_tokens
    if rank_tokens is None and facts.max_total_num_tokens is not None:
        kv_tokens = (
            f"{facts.max_total_num_tokens:,} reported per rank (what that counts under DCP "
            f"{dcp} in this release is unknown)"
        )
    else:
        kv_tokens = _fmt(rank_tokens, num) + " per rank"
        system = facts.system_kv_tokens
        if system is not None and system != rank_tokens:
            kv_tokens += f", {system:,} for the server"
        if dcp > 1 and rank_tokens is not None:
            kv_tokens += f" (DCP {dcp}: {rank_tokens // dcp:,} on each GPU)"

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

    version = _fmt(facts.version)
    version += (
        " (known to this eagledata)"
        if facts.release_known
        else f" (NOT known to this eagledata: read as {facts.release.version})"
    )
    if facts.attention_dp:
        layout = f"DP attention {facts.dp_ranks} ranks"
        if facts.attn_dp_size is not None:
            layout += f" (attn_dp_size {facts.attn_dp_size}, dp_size {_fmt(facts.dp_size)})"
    else:
        layout = f"DP {_fmt(facts.dp_size)}, DP attention {_on_off(facts.enable_dp_attention)}"
    rows = [
        ("model", model),
        ("sglang version", version),
        ("model dtype", _fmt(facts.dtype)),
        ("KV cache dtype", f"requested {_fmt(facts.kv_cache_dtype)}; ranks: {ranks}"),
        ("KV tokens", kv_tokens),
        (
            "parallelism",
            f"TP {_fmt(facts.tp_size)}, {layout}"
            + (f", DCP {facts.dcp_size}" if (facts.dcp_size or 1) > 1 else ""),
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
