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

import orjson

from eagledata.report.records_scan import RecordSeries
from eagledata.run.verify import run_status
from eagledata.run.writer import iter_jsonl_lines


def status_snapshot(path: Path, records: RecordSeries) -> dict[str, Any]:
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
        "quality": {"flags": dict(records.flags), "canary": _canary(path)},
        "load": _latest_load(path),
        "speculative": _speculative(records),
    }


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    found = []
    for line in iter_jsonl_lines(path):
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def _canary(path: Path) -> dict[str, Any]:
    checks = [c for c in _lines(path / "quality.jsonl") if c.get("kind") != "baseline"]
    passed = sum(1 for c in checks if c.get("verdict") == "pass")
    return {
        "enabled": (path / "quality.jsonl").is_file(),
        "checks": len(checks),
        "passed": passed,
        "failed": len(checks) - passed,
        "last": checks[-1] if checks else None,
    }


def _latest_load(path: Path) -> dict[str, Any] | None:
    latest: dict[str, dict[str, Any]] = {}
    for sample in _lines(path / "telemetry.jsonl"):
        key = str(sample.get("server", "?"))
        if sample.get("rank") is not None:
            key += f"#{sample['rank']}"
        latest[key] = sample
    return latest or None


def _speculative(records: RecordSeries) -> dict[str, Any] | None:
    if not records.spec_verify_steps:
        return None
    return {"accept_length": records.spec_tokens / records.spec_verify_steps}
