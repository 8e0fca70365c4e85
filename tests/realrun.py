"""What the real-server tier's fault and canary tests share: the trained model, a run's config,
the CLI as a subprocess, and the checks of a run against the server's own request log.

These tests serve the trained model (``TRAINED_MODEL``, ``src/eagledata/assets/model/
tiny-llama-chatml``) whatever ``EAGLEDATA_REAL_MODEL`` says: it answers like a chat model, with
peaked distributions and answers of 16 to ~400 tokens that end on EOS, and the canary's
statistics, retraction and the aborts are measured on that behaviour.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from conftest import eagledata_cmd, read_failures, read_records
from realserver import TRAINED_MODEL, RequestLog

SHAREGPT_ROWS = 40  # the bundled sample's rows


def write_config(
    path: Path,
    urls: list[str],
    out_dir: Path,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    samples: int = 1,
    concurrency: int | str = 8,
    server: str = "",
    canary: str = "enabled = false",
) -> Path:
    """A run's config: the servers, generation, the bundled ShareGPT sample; ``server`` and
    ``canary`` are extra lines of those sections."""
    listed = ", ".join(f'"{url}"' for url in urls)
    shown = f'"{concurrency}"' if isinstance(concurrency, str) else str(concurrency)
    path.write_text(
        f"""
[generation]
max_new_tokens = {max_new_tokens}
temperature = {temperature}
top_p = 1.0
samples_per_prompt = {samples}

[server]
urls = [{listed}]
{server}

[server.simulated]
enabled = false

[canary]
{canary}

[run]
out_dir = "{out_dir}"
shard_size = 5
concurrency = {shown}

[load]
poll_interval_s = 0.25
telemetry_interval_s = 0.5

[datasets.sample]
source = "bundled:samples/sharegpt.jsonl"
schema = "sharegpt"
"""
    )
    return path


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        eagledata_cmd(*args), capture_output=True, text=True, timeout=timeout, check=False
    )


def start_cli(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """The CLI in the background, in a process group of its own (a kill -9 ends it whole)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            eagledata_cmd(*args), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def generate_args(config: Path, *extra: str) -> tuple[str, ...]:
    return (
        "generate", "--config", str(config), "--model", str(TRAINED_MODEL), "--dataset",
        "sample", "--no-progress", "--no-canary", *extra,
    )  # fmt: skip


def assert_exactly_once(out: Path, rows: int, samples: int = 1) -> list[dict[str, Any]]:
    """Every (row, sample) once: a record, or a line of the failure file (a duplicate prompt is
    skipped there with its reason), never both, never twice. The records."""
    records = read_records(out)
    keys = collections.Counter((r["row_id"], r["sample"]) for r in records)
    twice = {key: n for key, n in keys.items() if n > 1}
    assert not twice, f"written more than once: {twice}"
    failed = collections.Counter((f.get("row_id"), f.get("sample", 0)) for f in read_failures(out))
    both = set(keys) & set(failed)
    assert not both, f"both a record and a failure: {both}"
    assert len(keys) + sum(failed.values()) == rows * samples, (len(keys), failed)
    return records


def assert_as_logged(records: list[dict[str, Any]], log: RequestLog) -> None:
    """Each record's ids are what the server's request log says it was asked and answered."""
    received, finished = log.received(), log.finished()
    for record in records:
        rid = record["rid"]
        assert rid in received and rid in finished, f"{rid} is not in the server's request log"
        assert record["input_ids"] == received[rid]["obj"]["input_ids"], rid
        assert record["output_ids"] == finished[rid]["out"]["output_ids"], rid


def metric(url: str, name: str) -> float:
    """The sum of a ``/metrics`` sample's series (0 before its first sample: SGLang creates
    the retraction counters at the first retraction)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(None, 1)[1])
    return total
