"""eagledata against the real SGLang 0.5.23 on this CPU (the ``realserver`` tier).

One real server for the module (a start is ~30-50 s), serving the tier's model
(``real_model_dir``) with a bf16 KV cache and its request log on; the KV guard's refusal of
``--kv-cache-dtype auto`` needs a second one. Every check reads the server's own request log:
what it was asked (``request.received``: input_ids) and what it answered (``request.finished``:
output_ids), by rid.

eagledata is pointed at the model by ``--model DIR`` (its tokenizer, the expected model, its
bf16 KV bytes per token); a config file written here holds the rest (the server's URL, the
generation settings, the bundled sample dataset).
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import read_records
from realrun import run_cli
from realserver import RequestLog, env, serve

# the first test of a session may build the venv (minutes) and start a server (up to a minute)
pytestmark = [pytest.mark.realserver, pytest.mark.timeout(1800)]

ROWS = 12
MAX_NEW_TOKENS = 24


def kv_bytes_per_token(model_dir: Path) -> int:
    """bf16 K and V, every layer: layers x KV heads x head dim x 2 x 2 bytes."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 * 2)


def write_config(path: Path, url: str, out_dir: Path, temperature: float) -> Path:
    path.write_text(
        f"""
[generation]
max_new_tokens = {MAX_NEW_TOKENS}
temperature = {temperature}
top_p = 1.0

[server]
urls = ["{url}"]
request_timeout_s = 120

[server.simulated]
enabled = false

[canary]
enabled = false

[run]
out_dir = "{out_dir}"
shard_size = 5
concurrency = 8

[datasets.sample]
source = "bundled:samples/sharegpt.jsonl"
schema = "sharegpt"
"""
    )
    return path


@pytest.fixture(scope="module")
def real_server(
    sglang_cpu_venv: Path, real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    with serve(sglang_cpu_venv, real_model_dir, tmp_path_factory.mktemp("server-bf16")) as server:
        print(f"real server ready in {server.ready_seconds:.0f} s", file=sys.stderr)
        yield server


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_generate_writes_exactly_what_the_server_logged(
    real_server: Any, real_model_dir: Path, tmp_path: Path, temperature: float
) -> None:
    out = tmp_path / "run"
    config = write_config(tmp_path / "real.toml", real_server.url, out, temperature)
    result = run_cli(
        "generate", "--config", str(config), "--model", str(real_model_dir), "--dataset",
        "sample", "--limit", str(ROWS), "--no-progress", "--no-canary",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_records(out)
    log = RequestLog.read(real_server.request_log_dir)
    received, finished = log.received(), log.finished()

    rows = collections.Counter((r["dataset"], r["row_id"], r["sample"]) for r in records)
    assert len(rows) == ROWS and set(rows.values()) == {1}, rows  # every row exactly once
    for record in records:
        rid = record["rid"]
        assert rid in received and rid in finished, f"{rid} is not in the server's request log"
        assert record["input_ids"] == received[rid]["obj"]["input_ids"], rid
        assert record["output_ids"] == finished[rid]["out"]["output_ids"], rid
        params = received[rid]["obj"]["sampling_params"]
        assert params["temperature"] == temperature
    if temperature == 0.0:
        # greedy: the server answers a repeated prompt alike, so equal prompts got equal answers
        by_prompt: dict[tuple[int, ...], set[tuple[int, ...]]] = collections.defaultdict(set)
        for record in records:
            by_prompt[tuple(record["input_ids"])].add(tuple(record["output_ids"]))
        assert all(len(answers) == 1 for answers in by_prompt.values())


def test_later_turns_hit_the_real_prefix_cache(
    real_server: Any, real_model_dir: Path, tmp_path: Path
) -> None:
    """``--turns all``: a turn's prompt extends the turns before it, answers included, so the
    server's radix cache holds its start. The cached_tokens each record keeps are the server's
    own (its log), and every later turn of a conversation reused its earlier turn's KV."""
    out = tmp_path / "run"
    config = write_config(tmp_path / "real.toml", real_server.url, out, 0.0)
    result = run_cli(
        "generate", "--config", str(config), "--model", str(real_model_dir), "--dataset",
        "sample", "--limit", "4", "--turns", "all", "--no-progress", "--no-canary",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_records(out)
    finished = RequestLog.read(real_server.request_log_dir).finished()
    later = [r for r in records if (r["turn"] or 0) > 0]
    assert later, "the first rows of the sample have no second assistant turn"
    for record in records:
        logged = finished[record["rid"]]["out"]["meta_info"]
        assert record["cached_tokens"] == logged["cached_tokens"], record["rid"]
    for record in later:
        previous = max(
            (r for r in records
             if r["conversation_id"] == record["conversation_id"] and r["turn"] < record["turn"]),
            key=lambda r: r["turn"],
        )  # fmt: skip
        # the server found the earlier turn in its radix cache: at least most of its prompt
        # (the answer's text need not encode back to its ids: random weights write fragments)
        assert record["cached_tokens"] >= len(previous["input_ids"]) // 2, (
            record["rid"],
            record["cached_tokens"],
            len(previous["input_ids"]),
        )


def test_the_kv_guard_accepts_the_real_bf16_server(real_server: Any, real_model_dir: Path) -> None:
    """Accepted, and ``--model``'s KV cell is the one the real pool holds: layers x KV heads x
    head dim x (K, V) x 2 bytes (512 for 2 layers, 2 KV heads of 32). The server's own figure
    (its pool's GiB, rounded to 0.001, over its token capacity) is within 5% of it; the guard
    itself leaves a pool this small unmeasured, and says so."""
    result = run_cli("check-server", real_server.url, "--model", str(real_model_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bf16 KV ok" in result.stdout
    found = re.search(r"bytes per KV token\s+([\d,]+) \(bf16 expects ([\d,]+)\)", result.stdout)
    assert found, result.stdout
    measured, expected = (int(group.replace(",", "")) for group in found.groups())
    assert expected == kv_bytes_per_token(real_model_dir)
    assert abs(measured - expected) <= 0.05 * expected, result.stdout


def test_the_kv_guard_refuses_a_real_auto_server(
    sglang_cpu_venv: Path, real_model_dir: Path, tmp_path: Path
) -> None:
    """``--kv-cache-dtype auto``: the real server reports "auto" at the top and in its internal
    state (its pool is bf16 on this CPU, but nothing it says proves it), so ``check-server`` and
    ``generate`` refuse it, naming the flag that fixes it, and the run writes nothing."""
    out = tmp_path / "run"
    with serve(sglang_cpu_venv, real_model_dir, tmp_path / "server", kv_cache_dtype="auto") as auto:
        checked = run_cli("check-server", auto.url, "--model", str(real_model_dir))
        config = write_config(tmp_path / "real.toml", auto.url, out, 0.0)
        generated = run_cli(
            "generate", "--config", str(config), "--model", str(real_model_dir), "--dataset",
            "sample", "--limit", "2", "--no-progress", "--no-canary",
        )  # fmt: skip
        received = RequestLog.read(auto.request_log_dir).received()
    for result in (checked, generated):
        output = result.stdout + result.stderr
        assert result.returncode == 4, output
        assert "'auto'" in output and "--kv-cache-dtype bf16" in output, output
    if out.exists():
        assert read_records(out) == []
    # nothing a run keeps reached the server: its own warm-up (text), eagledata's one-token probe
    asked = [event["obj"] for event in received.values() if event["obj"].get("input_ids")]
    assert all(obj["sampling_params"].get("max_new_tokens") == 1 for obj in asked), asked


def test_the_sgl_kernel_stand_in_matches_sglang_kernels(sglang_cpu_venv: Path) -> None:
    """The pure-PyTorch ops against references written from SGLang's Triton kernels: the
    request-to-token table write, the KV row copy, and MurmurHash3 (x86, 32-bit, seed 0) of
    (seed low, seed high, position, column) as four little-endian 4-byte blocks."""
    result = subprocess.run(
        [str(env.python(sglang_cpu_venv)), "-c", STAND_IN_CHECK], capture_output=True,
        text=True, timeout=300, env=env.server_env(), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


STAND_IN_CHECK = r"""
import struct
import torch
import sgl_kernel

# assign_req_to_token_pool_cpu: request i's slots go to its row, from start to end
table = torch.zeros((4, 16), dtype=torch.int32)
rows = torch.tensor([2, 0], dtype=torch.int64)
starts, ends = torch.tensor([3, 0]), torch.tensor([6, 2])
slots = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)
sgl_kernel.assign_req_to_token_pool_cpu(rows, table, starts, ends, slots, 16)
assert table[2, 3:6].tolist() == [11, 12, 13] and table[0, 0:2].tolist() == [21, 22]
assert int(table.sum()) == 11 + 12 + 13 + 21 + 22

# copy_all_layer_kv_cache_cpu: rows src -> tgt in every buffer, sources read before writes
layers = [torch.arange(8 * 4, dtype=torch.bfloat16).view(8, 4) + 100 * n for n in range(3)]
before = [layer.clone() for layer in layers]
ptrs = torch.tensor([layer.data_ptr() for layer in layers], dtype=torch.int64)
strides = torch.tensor([layer.stride(0) * layer.element_size() for layer in layers])
tgt, src = torch.tensor([1, 5]), torch.tensor([5, 6])
sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
for layer, old in zip(layers, before):
    assert torch.equal(layer[1], old[5]) and torch.equal(layer[5], old[6])
    assert torch.equal(layer[0], old[0]) and torch.equal(layer[7], old[7])


def murmur3_32(data, seed=0):
    c1, c2, h = 0xCC9E2D51, 0x1B873593, seed
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF
    for (k,) in struct.iter_unpack("<I", data):
        k = rotl((k * c1) & 0xFFFFFFFF, 15) * c2 & 0xFFFFFFFF
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= len(data)
    h ^= h >> 16; h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13; h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ (h >> 16)


seeds = [0, 1, 2**40 + 7, 2**64 - 1]
positions = [0, 5, 1000, 2**31 - 1]
columns = list(range(0, 3000, 7))
seed_t = torch.tensor([s - 2**64 if s >= 2**63 else s for s in seeds]).to(torch.uint64)
hashed = torch.ops.sgl_kernel.murmur_hash32_cpu.default(
    seed_t, torch.tensor(positions), torch.tensor(columns)
)
assert hashed.dtype == torch.uint32 and tuple(hashed.shape) == (4, len(columns))
got = hashed.to(torch.int64).tolist()
for i, (seed, pos) in enumerate(zip(seeds, positions)):
    for j, col in enumerate(columns):
        data = struct.pack("<IIII", seed & 0xFFFFFFFF, seed >> 32, pos, col)
        assert got[i][j] == murmur3_32(data), (seed, pos, col)

# anything else: importable (SGLang imports kernels of features it will not run), fails if called
try:
    sgl_kernel.build_tree_kernel_efficient_cpu()
except NotImplementedError as error:
    assert "stand-in" in str(error)
else:
    raise AssertionError("a missing kernel ran")
print("ok")
"""
