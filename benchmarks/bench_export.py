"""Export memory and speed: does ``eagledata export`` stay flat as a run grows?

Builds synthetic run directories of N records shaped like the reference job (prompts of ~600
tokens, answers of ~5,000, ids drawn from Kimi-K2.5's ~164k vocabulary), written by eagledata's
own ShardWriter and manifest, then runs ``export`` in a fresh child process per (format, N) and
reports the child's peak RSS (``ru_maxrss``), wall time and throughput. Flat memory means the peak
does not grow with N.

    python benchmarks/bench_export.py                          # N = 1,000 and 8,000; ids and hf
    python benchmarks/bench_export.py --records 2000 20000 --formats ids

Writes benchmarks/results/export.json and prints a markdown table. Needs ~2.5 GB of disk for 8,000
records (the run plus the export), in --workdir (default: a temporary directory, removed).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 163_840
PROMPT_TOKENS = 600
OUTPUT_TOKENS = 5_000

# ru_maxrss counts file pages mapped in (datasets memory-maps the Arrow file it copies); the
# sampled RssAnon peak is the heap alone, what grows if rows pile up in memory.
CHILD = """
import json, resource, sys, threading, time
from pathlib import Path
from eagledata.export import ExportOptions, export_runs
peak_anon = [0]
done = threading.Event()
def sample():
    while not done.is_set():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                peak_anon[0] = max(peak_anon[0], int(line.split()[1]))
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
report = export_runs([Path(sys.argv[1])], Path(sys.argv[2]), ExportOptions(format=sys.argv[3]))
seconds = time.perf_counter() - start
done.set()
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"exported": report.exported, "seconds": seconds, "peak_kib": peak_kib,
                  "anon_kib": peak_anon[0], "tokens": sum(report.lengths)}))
"""


def build_run(path: Path, records: int, seed: int = 0) -> None:
    from eagledata.config import (
        DatasetSettings,
        FrozenSettings,
        GenerationSettings,
        TokenizerSettings,
    )
    from eagledata.run.writer import ShardWriter
    from eagledata.rundir.lines import RecordFlags, RecordLine
    from eagledata.rundir.manifest import RunDir

    rng = random.Random(seed)
    run = RunDir(path)
    path.mkdir(parents=True)
    run.create(
        FrozenSettings(
            dataset_name="bench",
            dataset=DatasetSettings(source="bench.jsonl"),
            tokenizer=TokenizerSettings(name="bundled:tokenizer/tiny-chatml"),
            generation=GenerationSettings(max_new_tokens=8192),
            limit=None,
            shard_size=1000,
            expected_model=None,
            bf16_kv_bytes_per_token=None,
        ),
        {},
    )
    writer = ShardWriter(path, shard_size=1000, fsync_interval_s=60)
    for index in range(records):
        prompt = [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS + rng.randrange(-200, 200))]
        output = [rng.randrange(VOCAB) for _ in range(OUTPUT_TOKENS + rng.randrange(-500, 500))]
        writer.write(
            RecordLine(
                id=f"bench/{index}/0",
                dataset="bench",
                row_id=str(index),
                sample=0,
                finish_reason="stop",
                prompt_tokens=len(prompt),
                completion_tokens=len(output),
                created_at=0.0,
                messages=[{"role": "user", "content": "x" * 2000}],
                input_ids=prompt,
                output_ids=output,
                text="y" * 20_000,
                flags=RecordFlags(),
            )
        )
    writer.close()
    run.set_planned(records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1000, 8000])
    parser.add_argument("--formats", nargs="+", default=["ids", "hf"])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "export.json"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.workdir))
    results = []
    try:
        for records in args.records:
            run = work / f"run-{records}"
            started = time.perf_counter()
            build_run(run, records)
            print(f"built {records:,} records in {time.perf_counter() - started:.0f}s", flush=True)
            for fmt in args.formats:
                out = work / (f"out-{records}.jsonl" if fmt != "hf" else f"out-{records}-hf")
                child = subprocess.run(
                    [sys.executable, "-c", CHILD, str(run), str(out), fmt],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                point = json.loads(child.stdout.strip().splitlines()[-1])
                point.update(format=fmt, records=records)
                results.append(point)
                print(json.dumps(point), flush=True)
                shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()
            shutil.rmtree(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print("\n| format | records | tokens | peak RSS | peak heap (RssAnon) | wall | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for p in results:
        print(
            f"| {p['format']} | {p['records']:,} | {p['tokens'] / 1e6:,.1f}M | "
            f"{p['peak_kib'] / 1024:,.0f} MiB | {p['anon_kib'] / 1024:,.0f} MiB | "
            f"{p['seconds']:,.1f} s | "
            f"{p['tokens'] / p['seconds'] / 1e6:,.1f}M |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
