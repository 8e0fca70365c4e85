"""Invariant 2 on the data path: no record from a non-bf16 server ever lands (issue 4)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, make_config, read_records, run_cli, sim_config
from eagledata.errors import ServerRefusedError
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread
from hostile import HostileServer

DATASET = str(SAMPLES / "sharegpt.jsonl")
KIMI = {"expected_model": "moonshotai/Kimi-K2.5", "bf16_kv_bytes_per_token": 70272}


def checks(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "checks.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_bf16_server_passes_and_every_check_is_recorded(tokenizer_dir: str, tmp_path: Path) -> None:
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.02)) as sim:
        out = tmp_path / "run"
        summary = pipeline.generate(
            make_config([sim.url], out, server=KIMI), DATASET, None, progress=False
        )
    assert summary.written == 40
    logged = checks(out)
    assert len(logged) >= 2 and all(entry["ok"] for entry in logged)
    assert logged[0]["internal_kv_dtypes"] == ["bf16"]
    assert logged[0]["bytes_per_token"] == pytest.approx(70272, rel=0.01)


@pytest.mark.parametrize(
    ("server_setup", "problem"),
    [
        ({"kv_cache_dtype": "fp8_e4m3"}, "fp8_e4m3"),
        ({"kv_cache_dtype": "auto", "internal_kv_cache_dtype": "fp8_e4m3"}, "auto"),
        ({"kv_cache_dtype": "bf16", "kv_bytes_per_token": 35136}, "B per KV token"),
        ({"model_path": "someone/Other-Model"}, "someone/Other-Model"),
    ],
    ids=["fp8-flag", "auto-resolved-to-fp8", "fp8-sized-cache", "other-model"],
)
def test_refused_server_gets_no_request_and_no_record(
    tokenizer_dir: str, tmp_path: Path, server_setup: dict[str, Any], problem: str
) -> None:
    with SimServerThread(sim_config(tokenizer_dir, **server_setup)) as sim:
        new = tmp_path / "new" / "run"  # a refused start leaves no folder it created
        with pytest.raises(ServerRefusedError, match=problem):
            pipeline.generate(
                make_config([sim.url], new, server=KIMI), DATASET, None, progress=False
            )
        assert not (tmp_path / "new").exists()
        out = tmp_path / "run"  # a folder that was there keeps the refused check
        out.mkdir()
        with pytest.raises(ServerRefusedError, match=problem):
            pipeline.generate(
                make_config([sim.url], out, server=KIMI), DATASET, None, progress=False
            )
        assert sim.stats()["requests"] == 0
    assert read_records(out) == []
    assert checks(out) and not checks(out)[-1]["ok"]


def test_auto_that_resolved_to_bf16_passes(tokenizer_dir: str, tmp_path: Path) -> None:
    with SimServerThread(
        sim_config(tokenizer_dir, kv_cache_dtype="auto", internal_kv_cache_dtype="bf16")
    ) as sim:
        summary = pipeline.generate(
            make_config([sim.url], tmp_path / "run", server=KIMI), DATASET, None, progress=False
        )
    assert summary.written == 40


def test_switch_to_fp8_mid_run_lands_no_post_switch_record(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.1)) as sim:
        switched = threading.Event()

        def switch_after_some_work() -> None:
            # Switch once records have landed: the run is demonstrably mid-way.
            deadline = time.monotonic() + 20
            while not read_records(out) and time.monotonic() < deadline:
                time.sleep(0.005)
            sim.control(kv_cache_dtype="fp8_e4m3")
            switched.set()

        switcher = threading.Thread(target=switch_after_some_work, daemon=True)
        switcher.start()
        config = make_config(
            [sim.url],
            out,
            server={**KIMI, "guard_interval_s": 0.3, "guard_max_held": 1000},
            run={"concurrency": 4},
        )
        with pytest.raises(ServerRefusedError, match="fp8"):
            pipeline.generate(config, DATASET, None, progress=False)
        switcher.join()
        served_under = sim.stats()["rid_kv_dtype"]

    assert switched.is_set()
    records = read_records(out)
    assert 0 < len(records) < 40
    fp8_rids = {rid for rid, dtype in served_under.items() if dtype != "bf16"}
    assert fp8_rids, "the server did generate under fp8 after the switch"
    assert not fp8_rids & {record["rid"] for record in records}
    # What was held back is generated again on resume, against a good server.
    with SimServerThread(sim_config(tokenizer_dir)) as good:
        summary = pipeline.resume(out, server_urls=[good.url], progress=False)
    assert summary.written == 40 and summary.left == 0


# --- a /server_info without what SGLang always sends cannot vouch for bf16 ------------------

BARE_INFO = {"model_path": "tiny-chatml", "kv_cache_dtype": "bf16"}


def test_check_server_cannot_verify_a_server_info_of_two_fields(tokenizer_dir: str) -> None:
    """{model_path, kv_cache_dtype: bf16} and nothing else was called "bf16 KV ok" (exit 0)."""
    with HostileServer(tokenizer_dir, info=BARE_INFO) as server:
        done = run_cli("check-server", server.url, "--expected-model", "tiny-chatml")
    assert done.returncode == 4, done.stdout + done.stderr
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("verdict"))
    assert verdict.split(None, 1)[1] == (
        "REFUSED: cannot verify the KV cache: server_info has no version, max_total_num_tokens, "
        "internal_states, which every SGLang server sends (point eagledata at the SGLang server "
        "itself, not at something that answers /server_info in its place)"
    )


def test_a_run_against_a_server_info_of_two_fields_is_refused(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, info=BARE_INFO) as server:
        config = make_config([server.url], out, run={"limit": 2, "concurrency": 2})
        with pytest.raises(ServerRefusedError) as refused:
            pipeline.generate(config, str(SAMPLES / "prompts.jsonl"), None, progress=False)
    assert refused.value.exit_code == 4
    assert "cannot verify the KV cache: server_info has no version" in str(refused.value)
    assert "point eagledata at the SGLang server itself" in str(refused.value)
    assert not out.exists() or read_records(out) == []
