"""``eagledata report`` on a run of the reference job's size: time and peak memory.

Builds a synthetic run directory without a server (cached under ``--dir``, rebuilt when the
parameters change): N records of ~5k tokens in shards of 1,000 (prompt lengths log-normal around
~900 tokens, answers log-normal around ~4,000 and cut at max_new_tokens 8,192, random ids under
Kimi-K2.5's vocabulary, ~4 characters of text per token), 0.2% failures, and the side files of a
57-hour run: a KV check every 30 s, a telemetry sample every 5 s, a canary check every 10 min;
and, where this eagledata writes them, the shard index sidecars a real run's writer leaves.

Each measurement runs in a fresh process (so peak RSS is its own) over a warm page cache (one
untimed read first), and reports wall time, CPU time (the process's own, a fairer figure on a
busy machine) and peak RSS (VmHWM):

- ``records``: the report's record reader (``report.records_scan.scan_records``) alone;
- ``full parse``: the same lines through ``orjson.loads``, what a naive reader pays;
- ``status``: ``run.status.run_status``, the function behind ``eagledata status`` (the headline);
- ``report``: the whole ``eagledata report`` (gather, draw, write), as the CLI runs it.

    python benchmarks/bench_report.py                      # 22k and 88k records, ~10 minutes
    python benchmarks/bench_report.py --records 88000      # one size

Prints a markdown table and writes ``benchmarks/results/report.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).resolve().parent / "results" / "report.json"
VOCAB = 163_840
MAX_NEW = 8192
SHARD = 1000
HOURS = 57.0

MEASURE = {
    "records": "from eagledata.report.records_scan import scan_records\n"
    "n = scan_records(RUN).records",
    "full parse": "import orjson\nfrom eagledata.report.records_scan import committed_lines\n"
    "n = sum(1 for line in committed_lines(RUN) if orjson.loads(line))",
    "status": "from eagledata.rundir.status import run_status\nn = run_status(RUN).written",
    "report": "from eagledata.report import build_report\n"
    "build_report(RUN)\nn = len(RUN.joinpath('report.html').read_bytes())",
}
CHILD = """
import sys, time
from pathlib import Path
RUN = Path(sys.argv[1])
start, cpu = time.perf_counter(), time.process_time()
{code}
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent's high-water mark
peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(elapsed, peak, n, cpu)
"""


def _pool(rng: random.Random, count: int, make: Any) -> tuple[bytes, list[int]]:
    """One long comma-separated run of JSON items and where each item starts: any slice
    ``pool[starts[i]:starts[i + n] - 1]`` is ``n`` valid items."""
    items = [make(rng) for _ in range(count)]
    starts, at = [], 0
    for item in items:
        starts.append(at)
        at += len(item) + 1
    starts.append(at)
    return b",".join(items) + b",", starts


def build_run(path: Path, records: int, seed: int = 0) -> None:
    from eagledata.rundir.lines import FLAG_NAMES

    rng = random.Random(seed)
    ids, id_at = _pool(rng, 40_000, lambda r: str(r.randrange(VOCAB)).encode())
    words = [
        b"the",
        b"answer",
        b"think",
        b"\\n",
        b"tokens",
        b"x",
        b"value",
    ]  # ASCII: any cut is valid
    text = b" ".join(rng.choice(words) for _ in range(40_000))

    def ids_json(count: int) -> bytes:
        begin = rng.randrange(len(id_at) - count - 1)
        return b"[" + ids[id_at[begin] : id_at[begin + count] - 1] + b"]"

    shutil.rmtree(path, ignore_errors=True)
    (path / "shards").mkdir(parents=True)
    start = 1_764_000_000.0
    span = HOURS * 3600
    servers = ["http://10.0.0.1:30000"]
    failed = max(records // 500, 1)
    planned = records + failed
    for shard in range(0, records, SHARD):
        lines = []
        for index in range(shard, min(shard + SHARD, records)):
            prompt = max(8, int(rng.lognormvariate(6.8, 0.6)))
            answer = max(2, min(MAX_NEW, int(rng.lognormvariate(8.2, 0.55))))
            finish = "length" if answer == MAX_NEW else "stop"
            flags = ["truncated"] if finish == "length" else []
            if rng.random() < 0.004:
                flags.append("degenerate")
            head = orjson.dumps(
                {
                    "id": f"b2/{index:07d}/0",
                    "dataset": "b2",
                    "row_id": f"{index:07d}",
                    "sample": 0,
                    "finish_reason": finish,
                    "prompt_tokens": prompt,
                    "completion_tokens": answer,
                    "created_at": start + span * index / records + rng.random(),
                    "messages": [{"role": "user", "content": "q" * (prompt * 4)}],
                }
            )[:-1]
            chars = answer * 4
            offset = rng.randrange(len(text) - chars)
            tail = orjson.dumps(
                {
                    # the record's shape (rundir/lines.py): every flag present, no nulls
                    "flags": {name: name in flags for name in FLAG_NAMES},
                    "matched_token_id": 163586 if finish == "stop" else -1,
                    "cached_tokens": 0,
                    "server": servers[0],
                    "rid": f"r{index}",
                    "weight_version": "default",
                    "e2e_latency": 200.0,
                    "spec_verify_ct": 0,
                }
            )[1:]
            line = (
                head
                + b',"input_ids":'
                + ids_json(prompt)
                + b',"output_ids":'
                + ids_json(answer)
                + b',"text":"'
                + text[offset : offset + chars].rstrip(b"\\")
                + b'",'
                + tail
                + b"\n"
            )
            lines.append(line)
        (path / "shards" / f"shard-{shard // SHARD:06d}.jsonl").write_bytes(b"".join(lines))
    failures = [
        orjson.dumps(
            {
                "id": f"b2/f{i:06d}/0",
                "status": "failed",
                "reason": rng.choice(["timeout", "http"]),
                "message": "m",
                "dataset": "b2",
                "row_id": f"f{i}",
                "sample": 0,
                "attempts": 5,
                "time": start + rng.random() * span,
            }
        )
        for i in range(failed)
    ]
    (path / "failures.jsonl").write_bytes(b"\n".join(failures) + b"\n")
    checks = [
        orjson.dumps(
            {
                "time": start + t,
                "server": servers[0],
                "via": None,
                "ok": True,
                "problems": [],
                "model_path": "moonshotai/Kimi-K2.5",
                "kv_cache_dtype": "bf16",
                "internal_kv_dtypes": ["bf16"],
                "bytes_per_token": 70272.0,
                "max_total_num_tokens": 116000,
            }
        )
        for t in range(0, int(span), 30)
    ]
    (path / "checks.jsonl").write_bytes(b"\n".join(checks) + b"\n")
    telemetry = [
        orjson.dumps(
            {
                "time": start + t,
                "server": servers[0],
                "rank": None,
                "source": "loads",
                "token_usage": min(0.99, 0.8 + 0.15 * rng.random()),
                "num_running_reqs": rng.randrange(35, 50),
                "num_queue_reqs": rng.randrange(4),
                "gen_throughput": 400 + 200 * rng.random(),
                "num_retracted_reqs": int(rng.random() < 0.001),
                "in_flight": 48,
                "target": 48,
                "spec_accept_length": None,
            }
        )
        for t in range(0, int(span), 5)
    ]
    (path / "telemetry.jsonl").write_bytes(b"\n".join(telemetry) + b"\n")
    quality = [
        orjson.dumps(
            {
                "time": start + t,
                "server": servers[0],
                "kind": "baseline" if t == 0 else "check",
                "trigger": "period",
                "verdict": "pass",
                "stats": {
                    "mean_shift": rng.gauss(0, 0.004),
                    "trimmed_abs": 0.01 + 0.002 * rng.random(),
                    "topk_kl": 0.002 + 0.001 * rng.random(),
                },
                "thresholds": {"mean_shift": 0.02, "trimmed_abs": 0.03, "topk_kl": 0.01},
                "reason": "",
                "requests": 32,
                "prompt_tokens": 20000,
                "seconds": 4.0,
            }
        )
        for t in range(0, int(span), 600)
    ]
    (path / "quality.jsonl").write_bytes(b"\n".join(quality) + b"\n")
    (path / "plan.json").write_bytes(orjson.dumps({"planned": planned}))
    manifest = {
        "schema_version": 1,
        "created_at": start,
        "frozen": {
            "dataset_name": "b2",
            "generation": {"max_new_tokens": MAX_NEW},
            "tokenizer": {"name": "moonshotai/Kimi-K2.5"},
            "expected_model": "moonshotai/Kimi-K2.5",
        },
        "config": {"server": {"urls": servers, "guard_interval_s": 30}},
        "server_facts": {
            servers[0]: {"kv_cache_dtype": "bf16", "model_path": "moonshotai/Kimi-K2.5"}
        },
        "versions": {"eagledata": "bench"},
        "bench": {"records": records, "seed": seed},
    }
    (path / "run.json").write_bytes(orjson.dumps(manifest))


def index_shards(path: Path) -> int:
    """Write the shard index sidecars a real run's writer leaves (rundir/shardindex.py), where
    this eagledata has them and they are missing. Returns how many were written."""
    try:
        from eagledata.rundir.shardindex import build_index, write_index
        from eagledata.rundir.shardindex_format import index_path
    except ImportError:
        return 0
    written = 0
    for shard in sorted((path / "shards").glob("shard-*.jsonl")):
        if not index_path(shard).is_file():
            write_index(shard, build_index(shard))
            written += 1
    return written


def ensure_run(base: Path, records: int) -> Path:
    path = base / f"run-{records}"
    try:
        fresh = orjson.loads((path / "run.json").read_bytes())["bench"]["records"] != records
    except (OSError, KeyError, orjson.JSONDecodeError):
        fresh = True
    began = time.perf_counter()
    if fresh:
        build_run(path, records)
        print(f"built {path} in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    if indexed := index_shards(path):
        print(f"indexed {indexed} shards of {path}", file=sys.stderr)
    return path


def warm(path: Path) -> int:
    total = 0
    for file in sorted(path.rglob("*.jsonl")):
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                total += len(chunk)
    return total


def measure(name: str, run: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(code=MEASURE[name]), str(run)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        "what": name,
        "seconds": float(out[0]),
        "cpu_seconds": float(out[3]),
        "peak_rss_mb": int(out[1]) / 2**20,
        "result": int(out[2]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[22_000, 88_000])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/eagledata-bench-report"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--only", nargs="+", choices=list(MEASURE), default=list(MEASURE))
    args = parser.parse_args()
    rows = []
    for records in args.records:
        run = ensure_run(args.dir, records)
        size = warm(run)
        for name in args.only:
            row = {"records": records, "shard_bytes": size, **measure(name, run)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print("| records | JSONL on disk | what | wall | CPU | peak RSS |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['records']:,} | {row['shard_bytes'] / 1e9:.2f} GB | {row['what']} | "
            f"{row['seconds']:.1f} s | {row['cpu_seconds']:.1f} s | {row['peak_rss_mb']:.0f} MB |"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_avg_at_end": os.getloadavg(),
                },
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
