"""The bf16-KV guard's verdict on a server's facts (``ServerFacts``): bf16 KV or nothing.

The guard (docs/sglang.md) trusts no single field, because SGLang resolves
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
* the served ``model_path`` must be the expected model;
* and it must be an SGLang ``/server_info`` at all: every release sends ``version``,
  ``max_total_num_tokens`` and ``internal_states`` (one entry per rank); an answer without them
  (a proxy's, a stub's, one that holds only ``model_path`` and ``kv_cache_dtype``) cannot
  vouch for the cache, and is refused as "cannot verify", never called bf16.

A check that depends on how a release this eagledata does not know reports is skipped, with a
note (``ServerFacts.release_note``).
"""

from __future__ import annotations

import os
from pathlib import PurePath

from pydantic import BaseModel, ConfigDict

from eagledata.errors import ServerRefusedError
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.speculative import speculative_guard

BF16_NAMES = frozenset({"bf16", "bfloat16"})
BYTES_PER_TOKEN_TOLERANCE = 0.10
KVCACHE_ROUNDING_GIB = 0.005
ALWAYS_SENT = ("version", "max_total_num_tokens", "internal_states")
"""What every SGLang release's ``/server_info`` holds (its scheduler's facts and the version):
without them the dtype fields beside cannot be trusted to be SGLang's."""
CANNOT_VERIFY = "cannot verify the KV cache"
"""SGLang rounds ``memory_usage.kvcache`` to 2 decimals (GiB) up to 0.5.15.post1, 3 in 0.5.23."""


REFUSAL_FIX = "relaunch with --kv-cache-dtype bf16: eagledata launch-server"
"""What turns a refused server into an accepted one: named wherever a refusal is shown."""


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

    @property
    def kv_refused(self) -> bool:
        """Refused for its KV cache (the fix is the KV flag), not only for its model."""
        return any(
            ("kv_cache_dtype" in problem and not problem.startswith("speculative_draft"))
            or "per KV token" in problem
            for problem in self.problems
        )

    def summary(self) -> str:
        """One line: the verdict and its reasons."""
        if not self.ok:
            return "REFUSED: " + "; ".join(self.problems)
        dtypes = group_dtypes(self.kv_dtypes) or "no internal_states"
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
                + f" ({self.fix() or REFUSAL_FIX})"
            )

    @property
    def cannot_verify(self) -> bool:
        """The answer is not an SGLang ``/server_info``: nothing in it can vouch for bf16."""
        return any(problem.startswith(CANNOT_VERIFY) for problem in self.problems)

    def fix(self) -> str | None:
        """What to do about this refusal: point eagledata at SGLang itself (``cannot_verify``),
        the KV flag (``kv_refused``); None when neither is the cause (only the model is)."""
        if self.cannot_verify:
            return (
                "point eagledata at the SGLang server itself, not at something that answers "
                "/server_info in its place"
            )
        return REFUSAL_FIX if self.kv_refused else None


def _is_bf16(dtype: str | None) -> bool:
    return dtype is not None and dtype.lower() in BF16_NAMES


def group_dtypes(dtypes: list[str]) -> str:
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
    kv_heads: int | None = None,
    tolerance: float = BYTES_PER_TOKEN_TOLERANCE,
) -> GuardVerdict:
    """Judge whether ``facts`` describe a server with a bf16 KV cache serving the right model.

    ``bf16_bytes_per_token`` is one token's bf16 KV cell on one rank at attention TP 1; with
    ``kv_heads`` (an MHA/GQA model) the server's attention TP splits the heads as SGLang does
    (``per_rank_bytes``), without them (MLA) every rank keeps the whole cell."""
    bf16_bytes_per_token = per_rank_bytes(bf16_bytes_per_token, kv_heads, facts)
    problems: list[str] = []
    notes: list[str] = []
    requested = facts.kv_cache_dtype
    states = facts.internal_states or []
    missing = [name for name in ALWAYS_SENT if not getattr(facts, name)]
    if missing:
        problems.append(
            f"{CANNOT_VERIFY}: server_info has no {', '.join(missing)}, which every SGLang "
            "server sends"
        )

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
        elif not same_model(served, expected_model):
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


def per_rank_bytes(
    bf16_bytes_per_token: int | None, kv_heads: int | None, facts: ServerFacts
) -> int | None:
    """One rank's bf16 cell on this server: an MHA cell of ``kv_heads`` heads keeps
    ``max(1, kv_heads // (attn_tp // dcp))`` of them per rank (SGLang
    ``ModelConfig.get_num_kv_heads``); an MLA cell (``kv_heads`` None) is whole on every rank."""
    if bf16_bytes_per_token is None or kv_heads is None:
        return bf16_bytes_per_token
    per_head = bf16_bytes_per_token // kv_heads
    groups = max(1, facts.attn_tp_size // max(1, facts.dcp_size or 1))
    return per_head * max(1, kv_heads // groups)


def same_model(served: str, expected: str) -> bool:
    """Whether the server's ``model_path`` is the expected model: the same string; or, for a
    model folder, the same folder however the server was pointed at it (an absolute path to
    it, a relative one that ends the expected path, a hub cache snapshot of the hub name)."""
    served_clean, expected_clean = served.rstrip("/"), expected.rstrip("/")
    if served_clean == expected_clean:
        return True
    served_path, expected_path = PurePath(served_clean), PurePath(expected_clean)
    if expected_path.is_absolute():
        if served_path.is_absolute():
            return os.path.realpath(served_path) == os.path.realpath(expected_path)
        tail = tuple(part for part in served_path.parts if part not in (".", ""))
        return bool(tail) and ".." not in tail and expected_path.parts[-len(tail) :] == tail
    # a hub name served from its cache snapshot: .../models--ORG--NAME/snapshots/REVISION
    cache_folder = "models--" + expected_clean.replace("/", "--")
    found = served_path.parts
    return len(found) >= 3 and found[-3] == cache_folder and found[-2] == "snapshots"
