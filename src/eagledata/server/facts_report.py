"""The ``check-server`` report: a server's facts, one a line, and the guard's verdict last."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagledata.server.serverfacts import ServerFacts
from eagledata.server.speculative import format_speculative
from eagledata.server.verdict import GuardVerdict, group_dtypes


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

    ranks = group_dtypes(verdict.kv_dtypes) or "none reported"
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
        ("verdict", verdict.summary() + (f" ({verdict.fix()})" if verdict.fix() else "")),
    ]
    rows += [("note", note) for note in verdict.notes]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)
