"""A pytest plugin that totals what the robustness suites inject and check.

    PYTHONPATH=benchmarks pytest -p fault_figures -q -s tests/test_faults.py tests/test_crash.py \
        tests/test_router.py tests/test_storage.py

It reads each simulated server's own counters when it stops (outcomes by fault kind, HTTP
requests, /abort_request calls) and counts the records compared token for token against the
sim's expected output. Figures, not assertions: the suites themselves assert 0 lost, 0
duplicated, 0 corrupt.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import orjson

import eagledata.simserver as simserver
import eagledata.simserver.engine as engine
from eagledata.simserver import runner

TOTALS: collections.Counter[str] = collections.Counter()
_stop = runner.SimServerThread.stop
_expected_output = engine.expected_output


def _stop_and_count(self: runner.SimServerThread, *args: Any, **kwargs: Any) -> Any:
    thread = getattr(self, "_thread", None)
    if thread is None or not thread.is_alive():  # stopped already: nothing new to count
        return _stop(self, *args, **kwargs)
    with contextlib.suppress(Exception):
        stats = self.stats()
        TOTALS.update({f"outcome {kind}": n for kind, n in stats["outcomes"].items()})
        TOTALS["http requests to /generate"] += stats["requests"]
        TOTALS["/abort_request calls"] += len(stats["abort_calls"])
    return _stop(self, *args, **kwargs)


def _counted_expected_output(*args: Any, **kwargs: Any) -> Any:
    TOTALS["records checked token for token"] += 1
    return _expected_output(*args, **kwargs)


runner.SimServerThread.stop = _stop_and_count  # type: ignore[method-assign]
engine.expected_output = _counted_expected_output
simserver.expected_output = _counted_expected_output


def pytest_sessionfinish() -> None:
    figures = orjson.dumps(dict(sorted(TOTALS.items())), option=orjson.OPT_INDENT_2)
    print("\nfigures:", figures.decode())
