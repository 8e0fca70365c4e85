"""The ``ids`` export read by its consumers' own code (issue 8).

SpecForge 0.2.0's ``prepare_prompt_tasks`` (what ``data.prompts_path`` feeds to training) runs on
the export in a subprocess, from the PyPI wheel installed with ``--no-deps`` into a cache directory
(its pre-tokenized path needs only the standard library; the wheel pins torch, transformers and
sglang, which that path never imports). The test installs it the first time and skips, saying why,
only when the package registry cannot be reached. speculators' contract is checked on the same
file always, and its own builder where speculators and torch import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import SAMPLES, make_config, sim_config
from eagledata.export import ExportOptions, export_runs
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread
from exportkit import make_run, read_jsonl, record

SPECFORGE = "specforge==0.2.0"
CACHE = Path(os.environ.get("EAGLEDATA_TEST_CACHE", Path.home() / ".cache" / "eagledata-tests"))
UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "Connection refused",
)


def install_no_deps(requirement: str) -> Path:
    """``pip install --no-deps --target`` into the cache once; later runs reuse it."""
    target = CACHE / requirement.replace("==", "-")
    if (target / ".complete").is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = CACHE / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet",
         "--target", str(staging), requirement],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = result.stdout + result.stderr
        if any(marker in output for marker in UNREACHABLE):
            pytest.skip(f"cannot reach the package registry to install {requirement}")
        pytest.fail(f"pip install --no-deps {requirement} failed:\n{output}")
    (staging / ".complete").write_text(requirement)
    try:
        staging.rename(target)
    except OSError:  # another test process installed it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


SPECFORGE_READER = textwrap.dedent(
    """
    import json, sys
    import specforge
    from specforge.data.prompt_builder import prepare_prompt_tasks

    tasks = prepare_prompt_tasks(
        sys.argv[1], None, chat_template=None, max_length=int(sys.argv[2]),
        is_preformatted=False, train_only_last_turn=False, cache_dir=None, cache_key=None,
        num_proc=1,
    )
    json.dump({"module": specforge.__file__, "payloads": [t["payload"] for t in tasks]},
              sys.stdout)
    """
)


def specforge_reads(site: Path, path: Path, max_length: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", SPECFORGE_READER, str(path), str(max_length)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def exported(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real run (simulated server), plus hand-made rows with thinking, exported as ``ids``."""
    base = tmp_path_factory.mktemp("consumers")
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        config = make_config([server.url], base / "sim-run")
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    hand = make_run(
        base / "hand-run",
        [
            record("think", [1, 10, 11, 3], [30, 31, 4, 40, 41, 2]),
            record("cut", [1, 10, 12], [50, 51, 52], finish="length", flags=["truncated"]),
        ],
        planned=2,
    )
    out = base / "train.jsonl"
    report = export_runs([base / "sim-run", hand], out, ExportOptions())
    records = {}
    for run in (base / "sim-run", hand):
        for shard in sorted((run / "shards").glob("shard-*.jsonl")):
            for item in read_jsonl(shard):
                records[f"{run.name}/{item['id']}"] = item
    return {"path": out, "report": report, "records": records, "rows": read_jsonl(out)}


def test_specforge_prepare_prompt_tasks_reads_the_exact_ids(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    site = install_no_deps(SPECFORGE)
    max_length = exported["report"].length_stats()["max"]
    result = specforge_reads(site, exported["path"], max_length)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["module"].startswith(str(site))  # SpecForge's own code ran, not a stand-in
    payloads = answer["payloads"]
    rows, records = exported["rows"], exported["records"]
    assert len(payloads) == len(rows) == len(records)  # SpecForge dropped no row silently
    for payload, row in zip(payloads, rows, strict=True):
        source = records[row["id"]]
        prompt, output = source["input_ids"], source["output_ids"]
        assert payload == {
            "input_ids": prompt + output,
            "loss_mask": [0] * len(prompt) + [1] * len(output),
        }

    # A mutant file, one mask one element short: SpecForge itself must refuse it.
    mutant = tmp_path / "mutant.jsonl"
    broken = [dict(row) for row in rows]
    broken[1]["loss_mask"] = broken[1]["loss_mask"][:-1]
    mutant.write_text("".join(json.dumps(row) + "\n" for row in broken))
    result = specforge_reads(site, mutant, max_length)
    assert result.returncode != 0
    assert "ValueError" in result.stderr
    assert "mismatched input_ids/loss_mask lengths" in result.stderr


def test_speculators_contract_on_the_same_file(exported: dict[str, Any]) -> None:
    """What speculators' ``prepare-data`` passthrough demands of a pre-tokenized row."""
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(exported["path"]), split="train")
    assert {"input_ids", "loss_mask"} <= set(dataset.column_names)
    assert len(dataset) == len(exported["records"])
    for ids, mask in zip(dataset["input_ids"], dataset["loss_mask"], strict=True):
        assert len(ids) == len(mask)
        assert all(type(token) is int for token in ids)
        assert set(mask) <= {0, 1}
        assert sum(mask) >= 1
        # unshifted and contiguous: the prompt, then every generated token supervised
        first = mask.index(1)
        assert mask == [0] * first + [1] * (len(mask) - first)


def test_speculators_own_builder_passes_the_rows_through(exported: dict[str, Any]) -> None:
    preprocessing = pytest.importorskip(
        "speculators.data_generation.preprocessing",
        reason="speculators (and torch) are not installed; its contract is tested above",
    )
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(exported["path"]), split="train")
    max_length = exported["report"].length_stats()["max"]
    built = preprocessing.build_speculator_training_dataset(
        dataset, processor=None, max_length=max_length, num_proc=1
    )
    assert len(built) == len(exported["rows"])
    for row, want in zip(built, exported["rows"], strict=True):
        assert row["input_ids"].tolist() == want["input_ids"]
        assert row["loss_mask"].tolist() == want["loss_mask"]
        assert int(row["seq_len"]) == len(want["input_ids"])


SPECFORGE_VOCAB = textwrap.dedent(
    """
    import json, sys
    import torch
    from datasets import load_dataset
    from specforge.data.preprocessing import generate_vocab_mapping_file

    rows = load_dataset("json", data_files=sys.argv[1], split="train").with_format("torch")
    path = generate_vocab_mapping_file(
        rows, target_vocab_size=int(sys.argv[2]), draft_vocab_size=int(sys.argv[3]),
        cache_dir=sys.argv[4], cache_key="specforge",
    )
    mapping = torch.load(path)
    json.dump({"d2t": mapping["d2t"].tolist(), "t2d": mapping["t2d"].tolist()}, sys.stdout)
    """
)


def test_the_draft_vocab_mapping_is_specforges(
    exported: dict[str, Any], tmp_path: Path, tokenizer_dir: str
) -> None:
    torch = pytest.importorskip("torch", reason="--draft-vocab-size writes a torch file")
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    runs = [Path(r) for r in (run["run_dir"] for run in exported["report"].to_json()["runs"])]
    out = tmp_path / "train.jsonl"
    export_runs(runs, out, ExportOptions(draft_vocab_size=64))
    mapping = torch.load(tmp_path / "train.vocab_mapping.pt")
    assert mapping["d2t"].dtype == torch.long and mapping["d2t"].shape == (64,)
    assert mapping["t2d"].dtype == torch.bool and mapping["t2d"].shape == (vocab,)
    assert int(mapping["t2d"].sum()) == 64

    # SpecForge's own builder on the same rows, where its data-preparation stack imports.
    site = install_no_deps(SPECFORGE)
    result = subprocess.run(
        [sys.executable, "-c", SPECFORGE_VOCAB, str(out), str(vocab), "64", str(tmp_path / "sf")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(site)},
    )  # fmt: skip
    if result.returncode != 0 and "ModuleNotFoundError" in result.stderr:
        pytest.skip(f"specforge.data.preprocessing needs {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    assert mapping["d2t"].tolist() == theirs["d2t"]
    assert mapping["t2d"].tolist() == theirs["t2d"]
