"""The report's headline: the object ``eagledata status --json`` prints (docs/run-directory.md).

Counts, tokens, rates and ETA come from ``eagledata.run.verify.run_status``, the function behind
``status``, so the two can never disagree and whatever makes ``status`` faster (shard indexes)
makes the report faster too. The fields ``run_status`` does not hold yet (finish reasons by name,
flags, canary verdicts, latest load, speculative acceptance) are filled from what the report has
already read, under the names and meanings the run-directory doc gives them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagledata.report.records_scan import RecordSeries
from eagledata.run.verify import run_status


def status_snapshot(
    path: Path,
    records: RecordSeries,
    *,
    canary_enabled: bool,
    canary: list[dict[str, Any]],
    latest_load: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """``canary``: the lines of ``quality.jsonl`` in time order; ``latest_load``: the last
    telemetry sample per server (``URL`` or ``URL#rank``)."""
    status = run_status(path)
    times = [t for t in records.created_at if t > 0]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    overall = status.completion_tokens / span if span > 0 else 0.0
    return {
        "run_dir": status.run_dir,
        "planned": status.planned,
        "plan_complete": status.plan_complete,
        "written": status.written,
        "failed": status.failed,
        "skipped": status.skipped,
        "left": status.left,
        "prompt_tokens": status.prompt_tokens,
        "output_tokens": status.completion_tokens,
        "tok_s": {"overall": overall, "recent": status.recent_tok_per_s},
        "eta_s": status.eta_s,
        "finish_reasons": dict(records.finish_reasons),
        "failure_reasons": dict(status.failure_reasons),
        "quality": {"flags": dict(records.flags), "canary": _canary(canary_enabled, canary)},
        "load": latest_load or None,
        "speculative": _speculative(records),
    }


def _canary(enabled: bool, lines: list[dict[str, Any]]) -> dict[str, Any]:
    checks = [c for c in lines if c.get("kind") != "baseline"]
    passed = sum(1 for c in checks if c.get("verdict") == "pass")
    return {
        "enabled": enabled,
        "checks": len(checks),
        "passed": passed,
        "failed": len(checks) - passed,
        "last": checks[-1] if checks else None,
    }


def _speculative(records: RecordSeries) -> dict[str, Any] | None:
    if not records.spec_verify_steps:
        return None
    return {"accept_length": records.spec_tokens / records.spec_verify_steps}
