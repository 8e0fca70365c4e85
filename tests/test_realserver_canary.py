"""The logprob canary on real numerics: the real SGLang 0.5.23 on this CPU serving the trained
model (the ``realserver`` tier; docs/quality.md, "The canary on the real server").

A baseline recorded with ``eagledata canary`` from a real bf16 server with a 4,096-token pool:
it finishes under full load (its load runs fill the pool) and its self-check passes (the
command refuses a baseline whose self-check fails). Then ``CHECKS`` checks against the same
healthy server raise no false alarm, and ``FLOAT32_CHECKS`` against the same model and KV cache
computed in another dtype (``--dtype float32``) give a verdict with its statistics, recorded
whatever it is. An fp8 KV cache cannot run here: SGLang's CPU engine requires Intel AMX for it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from realrun import TRAINED_MODEL, run_cli, write_config
from realserver import RequestLog, serve

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(1800)]

CHECKS = 200
# Against float32: 200 checks measured the same statistics to the last digit (the CPU's numerics
# are deterministic), so 20 say what 200 did in a tenth of the time.
FLOAT32_CHECKS = 20
# A small canary (8 x 128 scored tokens, 2 greedy probes of 32), its load runs at the default
# 16 concurrent requests: the full load of a 4,096-token pool.
PROBE_TOKENS = 32
CANARY = f"""prompts = 8
reference_tokens = 128
probes = 2
probe_tokens = {PROBE_TOKENS}"""


@pytest.fixture(scope="module")
def bf16_server(sglang_cpu_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("server-canary-bf16")
    with serve(sglang_cpu_venv, TRAINED_MODEL, workdir, max_total_tokens=4096) as server:
        print(f"real server ready in {server.ready_seconds:.0f} s", file=sys.stderr)
        yield server


def config_for(folder: Path, url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_config(folder / "canary.toml", [url], folder / "unused", canary=CANARY)


@pytest.fixture(scope="module")
def baseline(bf16_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("canary")
    out = folder / "baseline.json"
    started = time.monotonic()
    result = run_cli(
        "canary", "--config", str(config_for(folder, bf16_server.url)), "--model",
        str(TRAINED_MODEL), "--dataset", "sample", "--out", str(out), timeout=900,
    )  # fmt: skip
    print(f"baseline in {time.monotonic() - started:.0f} s: {result.stdout}", file=sys.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def score(url: str, baseline: Path, out: Path, checks: int = CHECKS) -> tuple[dict[str, Any], str]:
    started = time.monotonic()
    result = run_cli(
        "canary", "--config", str(config_for(out.parent, url)), "--model", str(TRAINED_MODEL),
        "--against", str(baseline), "--checks", str(checks), "--out", str(out), timeout=1200,
    )  # fmt: skip
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"{checks} checks in {seconds:.0f} s: {result.stdout.strip()}", file=sys.stderr)
    body: dict[str, Any] = json.loads(out.read_text())
    assert len(body["checks"]) == checks
    return body, result.stdout.strip()


def test_the_baseline_finishes_under_load_on_a_small_pool(bf16_server: Any, baseline: Path) -> None:
    """The baseline's load runs reached the server beside its probes and scorings: the
    server's request log holds the canary's greedy probes (the default canary's once waited
    behind the load for ever on a pool this size)."""
    body = json.loads(baseline.read_text())
    assert len(body["runs"]) >= 2 and "load" in body["kinds"], body["kinds"]
    asked = [e["obj"] for e in RequestLog.read(bf16_server.request_log_dir).received().values()]
    probes = [
        obj for obj in asked
        if obj.get("input_ids") and obj["sampling_params"].get("max_new_tokens") == PROBE_TOKENS
        and obj["sampling_params"].get("temperature") == 0
    ]  # fmt: skip
    assert probes, "no greedy probe of the canary reached the server"


def test_no_false_alarm_on_the_healthy_real_server(
    bf16_server: Any, baseline: Path, tmp_path: Path
) -> None:
    body, line = score(bf16_server.url, baseline, tmp_path / "null-bf16.json")
    assert body["kv_guard"]["ok"], body["kv_guard"]
    alarms = [c for c in body["checks"] if c["fired"] or c["mismatch"]]
    assert not alarms, f"{len(alarms)} false alarms of {CHECKS}: {alarms[:3]}\n{line}"


def test_the_canary_against_the_real_server_in_float32(
    sglang_cpu_venv: Path, bf16_server: Any, baseline: Path, tmp_path: Path
) -> None:
    """The same model and bf16 KV cache, its compute in float32: whatever the canary says, it
    says it with its statistics (docs/quality.md records them)."""
    with serve(
        sglang_cpu_venv, TRAINED_MODEL, tmp_path / "server", max_total_tokens=4096,
        extra_flags=("--dtype", "float32"),
    ) as server:  # fmt: skip
        body, line = score(server.url, baseline, tmp_path / "float32.json", FLOAT32_CHECKS)
    fired = [c for c in body["checks"] if c["fired"] or c["mismatch"]]
    worst: dict[str, list[float]] = {}
    for check in body["checks"]:
        for name, value in check["stats"].items():
            worst.setdefault(name, []).append(value)
    print(
        f"float32 server: {len(fired)} of {FLOAT32_CHECKS} checks fired; thresholds "
        f"{body['thresholds']}; statistics min/median/max "
        + ", ".join(
            f"{name} {min(v):.4g}/{sorted(v)[len(v) // 2]:.4g}/{max(v):.4g}"
            for name, v in worst.items()
        )
        + f"; fired: {sorted({f for c in fired for f in c['fired']})[:8]}",
        file=sys.stderr,
    )
    assert body["thresholds"] and all(c["stats"] for c in body["checks"]), line
    assert set(worst) >= set(body["thresholds"]), (set(worst), body["thresholds"])
