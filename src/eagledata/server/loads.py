"""A server's live load, parsed from whichever signal it offers, without HTTP.

The signals, their routes and their order are registered in ``server/load_signals.py``
(``control`` asks them); each one's parser is here (``docs/sglang.md``, "Load signals"):

* ``GET /v1/loads`` (SGLang 0.5.8+): per DP rank ``num_running_reqs``, ``num_waiting_reqs``,
  ``num_used_tokens``, ``max_total_num_tokens``, ``token_usage`` (live), ``gen_throughput`` (0
  without ``--enable-metrics``), ``queues.retracted`` and, asked for ``spec``,
  ``speculative.accept_length``.
* ``GET /metrics`` (``--enable-metrics``): the same gauges as Prometheus text, one series per DP
  rank, plus the cumulative ``sglang:num_retracted_requests_total`` counter (0.5.7+). Gauges are
  refreshed on logged batches only (every 40 decode steps).
* ``GET /get_load`` (deprecated, gone in 0.5.21): per rank ``num_reqs``, ``num_waiting_reqs`` and
  ``num_tokens`` (used + queued tokens); no pool size, no usage.

**The extension point for a new figure of a signal** is one field of ``RankLoad`` and the line of
the parser(s) that fill it: ``capacity``'s controller gets the whole ``RankLoad``
(``LaneSample.load``) and ``run/telemetry.py`` writes every field to the lane's ``telemetry.jsonl``
line under the key its ``signal(...)`` names (the field's own name by default: then add the key,
with its description, to ``rundir/lines.py``'s ``TelemetryLine``). A field kept out of telemetry
says why (``signal(None, why=...)``). Behind a router, ``merge_workers`` says how the workers'
values of it add up. ``tests/test_telemetry_signals.py`` fails for a field that neither reaches a
telemetry line nor says why not, and for one a router's lane drops.
"""

from __future__ import annotations

import re
from dataclasses import Field, dataclass, field, replace
from typing import Any, Literal

LoadSource = Literal["loads", "metrics", "get_load"]

_TELEMETRY = "telemetry"
_WHY = "why"


def signal(telemetry: str | None, *, why: str = "") -> Any:
    """A ``RankLoad`` field (None by default) whose telemetry key is ``telemetry``, or, with
    None, one that no telemetry line carries, for the reason ``why``."""
    if telemetry is None and not why:
        raise ValueError("a signal kept out of telemetry says why")
    return field(default=None, metadata={_TELEMETRY: telemetry, _WHY: why})


def telemetry_key(load_field: Field[Any]) -> str | None:
    """The ``TelemetryLine`` key a ``RankLoad`` field is written under (None: not written)."""
    key: str | None = load_field.metadata.get(_TELEMETRY, load_field.name)
    return key


def kept_out_because(load_field: Field[Any]) -> str:
    """Why a ``RankLoad`` field reaches no telemetry line ("" for one that does)."""
    why: str = load_field.metadata.get(_WHY, "")
    return why


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One DP rank's numbers; None where the source does not report them.

    One field per signal: the controller reads it from ``LaneSample.load`` and telemetry writes
    it under ``telemetry_key`` (the module docstring: the extension point)."""

    rank: int = field(metadata={_TELEMETRY: None, _WHY: "a line names its lane's rank"})
    running: int | None = signal("num_running_reqs")
    waiting: int | None = signal("num_queue_reqs")
    used_tokens: int | None = signal(None, why="in token_usage, when the server reports none")
    pool_tokens: int | None = signal(None, why="in token_usage, when the server reports none")
    token_usage: float | None = None
    """Written as the lane's usage: this, else ``used_tokens / pool_tokens``."""
    gen_throughput: float | None = None
    retracted_waiting: int | None = signal(
        None, why="a retraction it shows counts in num_retracted_reqs (the controller's)"
    )
    max_running: int | None = signal(None, why="a cap of the gate's, not a load")
    spec_accept_length: float | None = None
    """Speculative tokens per verify step (``/v1/loads`` ``speculative.accept_length``, or the
    ``sglang:spec_accept_length`` gauge); None without speculative decoding (SGLang reports 0)."""


@dataclass(frozen=True, slots=True)
class ServerLoad:
    source: LoadSource
    ranks: tuple[RankLoad, ...]
    retracted_total: float | None = None
    """Cumulative retractions over all ranks (``/metrics`` 0.5.7+), None if not reported."""
    retracted_recent: float | None = None
    """Retractions in the server's last log window (the ``num_retracted_reqs`` gauge)."""


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_v1_loads(body: Any) -> ServerLoad | None:
    """``/v1/loads`` JSON (S9 shape, and the later one without ``aggregate``)."""
    entries = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    ranks = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        raw_queues = entry.get("queues")
        queues: dict[str, Any] = raw_queues if isinstance(raw_queues, dict) else {}
        ranks.append(
            RankLoad(
                rank=_int(entry.get("dp_rank")) or index,
                running=_int(entry.get("num_running_reqs")),
                waiting=_int(entry.get("num_waiting_reqs")),
                used_tokens=_int(entry.get("num_used_tokens")),
                pool_tokens=_int(entry.get("max_total_num_tokens")),
                token_usage=_float(entry.get("token_usage")),
                gen_throughput=_float(entry.get("gen_throughput")),
                retracted_waiting=_int(queues.get("retracted")),
                max_running=_int(entry.get("max_running_requests")),
                spec_accept_length=_accept_length(entry.get("speculative")),
            )
        )
    if not ranks:
        return None
    return ServerLoad("loads", tuple(sorted(ranks, key=lambda r: r.rank)))


def _accept_length(section: Any) -> float | None:
    """``/v1/loads`` ``speculative`` (S9 ``SpeculativeMetrics``): present once a verify ran."""
    value = _float(section.get("accept_length")) if isinstance(section, dict) else None
    return value if value else None


_SAMPLE = re.compile(r"^(sglang:[a-z_]+)(?:\{([^}]*)\})?\s+(\S+)")
_DP_RANK = re.compile(r'dp_rank="(\d+)"')
_GAUGE_FIELDS = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:num_used_tokens": "used_tokens",
    "sglang:max_total_num_tokens": "pool_tokens",
    "sglang:token_usage": "token_usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:spec_accept_length": "spec_accept_length",
}
_FLOAT_FIELDS = ("token_usage", "gen_throughput", "spec_accept_length")
_RETRACTED_COUNTERS = ("sglang:num_retracted_requests_total",)
_RETRACTED_GAUGES = ("sglang:num_retracted_reqs",)
METRIC_NAMES = (*_GAUGE_FIELDS, *_RETRACTED_COUNTERS, *_RETRACTED_GAUGES)
"""Every ``/metrics`` sample name eagledata reads; tests/test_sglang_releases.py finds each one
in every supported release's own metrics collectors."""


def parse_metrics(text: str) -> ServerLoad | None:
    """Prometheus text from ``/metrics``: gauges per ``dp_rank`` label (rank 0 without one)."""
    values: dict[int, dict[str, float]] = {}
    counter: float | None = None
    recent: float | None = None
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if name in _RETRACTED_COUNTERS:
            counter = (counter or 0.0) + value
        elif name in _RETRACTED_GAUGES:
            recent = (recent or 0.0) + value
        elif name in _GAUGE_FIELDS:
            rank_match = _DP_RANK.search(labels or "")
            rank = int(rank_match.group(1)) if rank_match else 0
            values.setdefault(rank, {})[_GAUGE_FIELDS[name]] = value
    if not values:
        return None
    ranks = []
    for rank, fields in sorted(values.items()):
        kwargs: dict[str, Any] = {}
        for key, value in fields.items():
            kwargs[key] = value if key in _FLOAT_FIELDS else int(value)
        if not kwargs.get("spec_accept_length"):  # SGLang logs 0 without speculative decoding
            kwargs.pop("spec_accept_length", None)
        ranks.append(RankLoad(rank=rank, **kwargs))
    return ServerLoad("metrics", tuple(ranks), retracted_total=counter, retracted_recent=recent)


def parse_get_load(body: Any) -> ServerLoad | None:
    """``/get_load``: a list per DP rank; ``num_tokens`` counts used and queued tokens."""
    if isinstance(body, dict):
        body = [body]
    if not isinstance(body, list):
        return None
    ranks = []
    for index, entry in enumerate(body):
        if not isinstance(entry, dict):
            continue
        total, waiting = _int(entry.get("num_reqs")), _int(entry.get("num_waiting_reqs"))
        running = total - waiting if total is not None and waiting is not None else None
        ranks.append(
            RankLoad(
                rank=_int(entry.get("dp_rank")) or index,
                running=running,
                waiting=waiting,
                used_tokens=_int(entry.get("num_tokens")),
            )
        )
    return ServerLoad("get_load", tuple(ranks)) if ranks else None


def in_logical_tokens(load: ServerLoad, factor: int) -> ServerLoad:
    """The pool counted in every DCP rank's share: 0.5.15.post1 reports ``max_total_num_tokens``
    as one DCP rank's rows (``factor`` = the DCP size), while its used tokens and usage already
    count the shares (``ServerFacts.capacity_factor``)."""
    if factor == 1:
        return load
    ranks = tuple(
        replace(rank, pool_tokens=rank.pool_tokens * factor)
        if rank.pool_tokens is not None
        else rank
        for rank in load.ranks
    )
    return replace(load, ranks=ranks)


def with_retractions(load: ServerLoad, metrics: ServerLoad | None) -> ServerLoad:
    """``/v1/loads`` has no retraction counter: take it (and a missing throughput) from
    ``/metrics`` when the server offers both."""
    if metrics is None:
        return load
    by_rank = {rank.rank: rank for rank in metrics.ranks}
    ranks = []
    for rank in load.ranks:
        other = by_rank.get(rank.rank)
        if other is not None and not rank.gen_throughput and other.gen_throughput:
            rank = replace(rank, gen_throughput=other.gen_throughput)
        ranks.append(rank)
    return replace(
        load,
        ranks=tuple(ranks),
        retracted_total=metrics.retracted_total,
        retracted_recent=metrics.retracted_recent,
    )


def _sum(values: list[Any]) -> Any:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def merge_workers(loads: list[ServerLoad]) -> ServerLoad | None:
    """The workers behind a router as one lane: the router, not eagledata, picks the worker of
    each request, so what counts is their pools and queues together."""
    ranks = [rank for load in loads for rank in load.ranks]
    if not ranks:
        return None
    used = _sum([rank.used_tokens for rank in ranks])
    pool = _sum([rank.pool_tokens for rank in ranks])
    usage = used / pool if used is not None and pool else None
    merged = RankLoad(
        rank=0,
        running=_sum([rank.running for rank in ranks]),
        waiting=_sum([rank.waiting for rank in ranks]),
        used_tokens=used,
        pool_tokens=pool,
        token_usage=usage,
        gen_throughput=_sum([rank.gen_throughput for rank in ranks]),
        retracted_waiting=_sum([rank.retracted_waiting for rank in ranks]),
        max_running=_sum([rank.max_running for rank in ranks]),
        spec_accept_length=_mean([rank.spec_accept_length for rank in ranks]),
    )
    totals = [load.retracted_total for load in loads]
    total = None if any(t is None for t in totals) else _sum(totals)
    return ServerLoad(loads[0].source, (merged,), retracted_total=total)


def _mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None
