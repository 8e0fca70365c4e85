"""Every load signal a server may offer, registered in one place, best first.

``ControlCalls.read_load`` (``server/control.py``) asks each signal's route in this order and
takes the first one that answers; a signal that ``supplements`` is asked even after a better one
answered, and fills in what that one lacks. Adding a signal is one entry here, with its parser
(``server/loads.py``: it fills ``RankLoad``, whose fields are the controller's and telemetry's)
and its name in ``LoadSource`` (the ``source`` telemetry writes). The docs' table
(``scripts/gen_docs.py``) and the messages that name the signals read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagledata.server.loads import (
    LoadSource,
    ServerLoad,
    parse_get_load,
    parse_metrics,
    parse_v1_loads,
    with_retractions,
)


@dataclass(frozen=True, slots=True)
class LoadSignal:
    name: LoadSource
    """What telemetry's ``source`` says when this signal was read."""
    route: str
    """What is asked: the path, with the query it needs."""
    parse: Callable[[Any], ServerLoad | None]
    """The server's answer (parsed JSON, or the text when ``text``) as a load; None if unusable."""
    since: str
    """Which SGLang releases offer it, and under which flag."""
    summary: str
    """One line for the docs: what it gives."""
    text: bool = False
    """The answer is read as text (Prometheus), not JSON."""
    supplements: Callable[[ServerLoad, ServerLoad], ServerLoad] | None = None
    """Asked even after a better signal answered: how it fills in that one's load."""

    @property
    def path(self) -> str:
        """The route without its query: a server that answers it 404 offers no such signal."""
        return self.route.split("?")[0]


LOAD_SIGNALS: dict[LoadSource, LoadSignal] = {
    signal.name: signal
    for signal in (
        LoadSignal(
            "loads",
            "/v1/loads?include=core,memory,spec,queues",
            parse_v1_loads,
            "0.5.8+",
            "per DP rank: running and waiting requests, used and pool tokens, live KV usage, "
            "throughput (0 without `--enable-metrics`), retracted requests waiting, "
            "speculative acceptance",
        ),
        LoadSignal(
            "metrics",
            "/metrics",
            parse_metrics,
            "with `--enable-metrics`",
            "the same gauges as Prometheus text, refreshed on logged batches only, plus the "
            "cumulative retraction counter (0.5.7+), which it also adds to `/v1/loads`",
            text=True,
            supplements=lambda better, metrics: with_retractions(better, metrics),
        ),
        LoadSignal(
            "get_load",
            "/get_load",
            parse_get_load,
            "through 0.5.20 (deprecated)",
            "per DP rank: requests, waiting requests, used plus queued tokens; no pool size",
        ),
    )
}


def routes_named(last: str = "and") -> str:
    """The signals' routes as a message names them: ``/v1/loads, /metrics and /get_load``."""
    paths = [signal.path for signal in LOAD_SIGNALS.values()]
    return paths[0] if len(paths) == 1 else f"{', '.join(paths[:-1])} {last} {paths[-1]}"
