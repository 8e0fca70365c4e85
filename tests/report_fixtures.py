"""Hand-written ``quality.jsonl`` and ``telemetry.jsonl`` in the documented shapes
(docs/run-directory.md), for reports of runs made before the canary and the load sampler."""

from __future__ import annotations

from pathlib import Path

import orjson

# Signed as the canary writes them: mean_shift fires below its (negative) threshold.
THRESHOLDS = {"mean_shift": -0.02, "topk_kl": 0.01}


def write_canary(run: Path, start: float) -> None:
    checks = [
        ("baseline", "start", "pass", {"mean_shift": 0.001, "topk_kl": 0.002}, ""),
        ("check", "period", "pass", {"mean_shift": -0.015, "topk_kl": 0.004}, ""),
        (
            "check",
            "reconnect",
            "drift",
            {"mean_shift": 0.05, "topk_kl": 0.03},
            "topk_kl 0.03 > 0.01",
        ),
    ]
    lines = []
    for offset, (kind, trigger, verdict, stats, reason) in zip((-5, 1, 2), checks, strict=True):
        entry = {
            "time": start + offset,
            "server": "http://a:1",
            "kind": kind,
            "trigger": trigger,
            "verdict": verdict,
            "stats": stats,
            "thresholds": THRESHOLDS,
            "reason": reason,
            "requests": 8,
            "prompt_tokens": 4000,
            "seconds": 1.5,
        }
        lines.append(orjson.dumps(entry) + b"\n")
    (run / "quality.jsonl").write_bytes(b"".join(lines))


def write_telemetry(run: Path, start: float, tail: bytes = b"") -> None:
    """Two servers, 20 samples each; a retraction at samples 7 and 8 on both."""
    lines = []
    for step in range(20):
        for server, usage in (("http://a:1", 0.5 + step / 50), ("http://b:2", 0.3)):
            sample = {
                "time": start + step * 0.1,
                "server": server,
                "rank": None,
                "source": "loads",
                "token_usage": usage,
                "num_running_reqs": 40 + step,
                "num_queue_reqs": step % 3,
                "gen_throughput": 500.0,
                "num_retracted_reqs": min(max(step - 6, 0), 2),  # a counter: +1 at 7 and at 8
                "in_flight": 42,
                "target": 44,
                "spec_accept_length": None,
            }
            lines.append(orjson.dumps(sample) + b"\n")
    (run / "telemetry.jsonl").write_bytes(b"".join(lines) + tail)


def spread_in_time(run: Path, step_s: float, latency_s: float) -> float:
    """Rewrite a finished run's records as if they had completed ``step_s`` apart, each in
    flight for ``latency_s``: a run of minutes drawn from one of a second (the rate is drawn only
    past rundir/rates.py's MIN_RATED_S of active time). Indexes go (rebuilt on read). Returns the
    first completion time."""
    from eagledata.rundir.lines import RecordLine

    shards = sorted((run / "shards").glob("shard-*.jsonl"))
    first = min(
        RecordLine.parse(line).created_at
        for shard in shards
        for line in shard.read_bytes().splitlines()
    )
    step = 0
    for shard in shards:
        lines = []
        for line in shard.read_bytes().splitlines():
            record = RecordLine.parse(line)
            moved = record.model_copy(
                update={"created_at": first + step * step_s, "e2e_latency": latency_s}
            )
            lines.append(moved.dump() + b"\n")
            step += 1
        shard.write_bytes(b"".join(lines))
    for index in (run / "shards").glob("*.idx.json"):
        index.unlink()
    return first
