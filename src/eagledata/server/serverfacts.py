"""What a running SGLang server says about itself: ``ServerFacts``, read as its release reports.

``ServerFacts`` is parsed from the body of ``GET /server_info`` (``/get_server_info`` on older
servers): every ServerArgs field flat at the top level, rank 0's scheduler info, and
``internal_states`` (one entry per attention-DP rank, each with the scheduler's own args and
``memory_usage``). Missing keys become ``None``; a wrong type for a key the guard reads is a
refusal, never a silent ``None``.

How a release reports DP attention, DCP capacity and the rank pin comes from its file in
``configs/sglang-releases/`` (``profiles/releases.py``), chosen by the ``version`` the server
states. A version this eagledata does not know is read as the newest known release below it,
said once (``release_note``), and every check that depends on what changed is skipped, never
guessed. The bf16-KV guard's verdict on these facts is ``server/verdict.py``; the
``check-server`` report of both, ``server/facts_report.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from eagledata.server.speculative import SpeculativeSettings, settings_from_facts

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
    def attn_tp_size(self) -> int:
        """Ranks one request's attention is split over: the TP size, divided by the attention
        DP width under DP attention (``attn_dp_size`` in 0.5.23, ``dp_size`` before)."""
        tp = max(1, self.tp_size or 1)
        if (self.attn_dp_size or 1) > 1:
            return max(1, tp // (self.attn_dp_size or 1))
        if self.enable_dp_attention:
            return max(1, tp // max(1, self.dp_size or 1))
        return tp

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
