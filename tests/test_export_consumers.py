"""The export read by the trainers' own tools, for real (issues 8 and 28).

speculators 0.9.0's ``prepare-data`` CLI and SpecForge 0.2.0's data code run on the CPU, offline,
in a venv of their own (``tests/trainerkit.py`` builds it once per machine from
``tests/trainers-requirements.txt``; it skips, saying so, only when the package registry cannot
be reached). Each route the README and the export's own hints name is run as printed, and what
the tool made of the rows is compared, row for row and order-free, with the run's records: the
ids P + O and the exact mask [0]*|P| + [1]*|O|, cut where the tool cuts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import SAMPLES, make_config, sim_config
from eagledata.export import ExportOptions, ExportReport, export_runs
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread
from exportkit import make_run, read_jsonl, record
from trainerkit import (
    expected_rows,
    prepared_rows,
    python_json,
    run,
    torch_overlay,
    trainers_venv,
)

# The first test to need the venv builds it (a minute or two, once per machine: README).
pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]  # the trainers' own environments


@pytest.fixture(scope="module")
def trainers() -> Path:
    return trainers_venv()


@pytest.fixture(scope="module")
def exported(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real run (simulated server) and hand-made rows with thinking, exported as ``ids`` (with
    ``--token-counts``) and as ``hf``."""
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
    runs = [base / "sim-run", hand]
    out = base / "train.jsonl"
    report = export_runs(runs, out, ExportOptions(token_counts=True))
    hf_report = export_runs(runs, base / "train-hf", ExportOptions(format="hf"))
    records = {}
    for run_dir in runs:
        for shard in sorted((run_dir / "shards").glob("shard-*.jsonl")):
            for item in read_jsonl(shard):
                records[f"{run_dir.name}/{item['id']}"] = item
    assert report.exported == hf_report.exported == len(records)
    return {
        "base": base,
        "runs": runs,
        "path": out,
        "report": report,
        "hf_report": hf_report,
        "records": records,
        "rows": read_jsonl(out),
    }


# --- SpecForge --------------------------------------------------------------------------------

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
    print(json.dumps({"module": specforge.__file__, "payloads": [t["payload"] for t in tasks]}))
    """
)


def test_specforge_prepare_prompt_tasks_reads_the_exact_ids(
    trainers: Path, exported: dict[str, Any], tmp_path: Path
) -> None:
    max_length = exported["report"].length_stats()["max"]
    answer = python_json(trainers, SPECFORGE_READER, exported["path"], str(max_length))
    assert answer["module"].startswith(str(trainers))  # SpecForge's own code ran, not a stand-in
    payloads = answer["payloads"]
    rows, records = exported["rows"], exported["records"]
    assert len(payloads) == len(rows) == len(records)  # SpecForge dropped no row silently
    for payload, row in zip(payloads, rows, strict=True):  # SpecForge keeps the file's order
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
    result = run([trainers / "bin" / "python", "-c", SPECFORGE_READER, mutant, str(max_length)])
    assert result.returncode != 0
    assert "mismatched input_ids/loss_mask lengths" in result.stderr


EAGLEDATA_VOCAB = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from eagledata.export import ExportOptions, export_runs

    out, sizes, runs = Path(sys.argv[1]), sys.argv[2].split(","), [Path(p) for p in sys.argv[3:]]
    for size in sizes:
        export_runs(runs, out / f"train-{size}.jsonl", ExportOptions(draft_vocab_size=int(size)))
    """
)

SPECFORGE_VOCAB = textwrap.dedent(
    """
    import json, sys
    import torch
    from datasets import load_dataset
    from specforge.data.preprocessing import generate_vocab_mapping_file

    data, vocab, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = load_dataset("json", data_files=data, split="train").with_format("torch")
    answer = {}
    for size in sys.argv[4].split(","):
        theirs = torch.load(generate_vocab_mapping_file(
            rows, target_vocab_size=vocab, draft_vocab_size=int(size),
            cache_dir=out, cache_key=f"specforge-{size}",
        ))
        ours = torch.load(f"{out}/train-{size}.vocab_mapping.pt")
        answer[size] = {}
        for side, m in (("specforge", theirs), ("eagledata", ours)):
            d2t, t2d = m["d2t"], m["t2d"]
            used = t2d.nonzero().flatten().tolist()
            answer[size][side] = {"d2t": (str(d2t.dtype), d2t.tolist()),
                                  "t2d": (str(t2d.dtype), len(t2d), used)}
    print(json.dumps(answer))
    """
)


def test_the_draft_vocab_mapping_is_specforges(
    trainers: Path, exported: dict[str, Any], tmp_path: Path, tokenizer_dir: str
) -> None:
    """eagledata's ``--draft-vocab-size`` file, tensor for tensor, is what SpecForge's own builder
    makes of the same rows: at 64 (fewer than the supervised ids) and 1000 (more: padded)."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    supervised = {token for item in exported["records"].values() for token in item["output_ids"]}
    assert 64 < len(supervised) < 1000 <= vocab
    sizes = "64,1000"
    # the project's interpreter, given torch (and nothing else of the trainers' venv)
    path = os.pathsep.join(
        filter(None, [str(torch_overlay(trainers)), os.environ.get("PYTHONPATH")])
    )
    made = run([sys.executable, "-c", EAGLEDATA_VOCAB, tmp_path, sizes, *exported["runs"]],
               env={"PYTHONPATH": path})  # fmt: skip
    assert made.returncode == 0, made.stderr
    answer = python_json(
        trainers, SPECFORGE_VOCAB, tmp_path / "train-64.jsonl", str(vocab), tmp_path, sizes
    )
    for size, sides in answer.items():
        ours, theirs = sides["eagledata"], sides["specforge"]
        assert ours == theirs, size
        assert ours["d2t"][0] == "torch.int64" and len(ours["d2t"][1]) == int(size)
        assert ours["t2d"][:2] == ["torch.bool", vocab] and len(ours["t2d"][2]) == int(size)
    # the small draft vocabulary holds supervised ids only, the large one all of them
    assert set(answer["64"]["eagledata"]["t2d"][2]) <= supervised
    assert supervised <= set(answer["1000"]["eagledata"]["t2d"][2])


# --- speculators ------------------------------------------------------------------------------


def hint(report: ExportReport) -> list[str]:
    """The export's own ``speculators:`` hint, as arguments to ``speculators``."""
    (line,) = [line for line in report.hand_off() if line.startswith("speculators: ")]
    return shlex.split(line.removeprefix("speculators: "))


def prepare(trainers: Path, tokenizer: str, args: list[str], out: Path) -> str:
    """``speculators prepare-data ARGS`` (the README's route: ``--model`` the run's tokenizer, no
    ``--render-endpoint``); returns its log."""
    result = run([trainers / "bin" / "speculators", *args, "--model", tokenizer, "--output", out])
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def logged(log: str, pattern: str) -> int:
    """The sum of the counts a warning logged (one line per map worker)."""
    return sum(int(n) for n in re.findall(pattern, log))


@pytest.fixture(scope="module")
def prepared(
    trainers: Path,
    exported: dict[str, Any],
    tokenizer_dir: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """The ``ids`` export through the command its hint prints, with the token frequencies."""
    out = tmp_path_factory.mktemp("prepared") / "prepared"
    args = [*hint(exported["report"]), "--no-skip-token-freq"]
    return {"out": out, "log": prepare(trainers, tokenizer_dir, args, out)}


def test_speculators_prepare_data_takes_every_row_as_exported(
    trainers: Path, exported: dict[str, Any], prepared: dict[str, Any]
) -> None:
    report = exported["report"]
    assert hint(report) == ["prepare-data", "--data", str(exported["path"]), "--seq-length",
                            str(report.length_stats()["max"])]  # fmt: skip
    assert "Speculator-format rows: using their loss mask, skipping render" in prepared["log"]
    got, order = prepared_rows(prepared["out"])
    want, cut, dropped = expected_rows(exported["records"].values(), report.length_stats()["max"])
    assert (cut, dropped) == (0, 0)
    assert got == want  # every record, its exact ids and mask, nothing else
    # shuffled (--seed, default 0): the file's order is gone, rows match by content only
    assert order != [(tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in exported["rows"]]

    # token_freq.pt: the supervised ids' counts, the same as eagledata's --token-counts
    freq = python_json(
        trainers,
        "import json, sys, torch; print(json.dumps(torch.load(sys.argv[1])))",
        prepared["out"] / "token_freq.pt",
    )
    assert freq == json.loads(Path(report.files["token counts"]).read_text())


def test_speculators_keeps_an_old_output_and_cuts_rows_at_seq_length(
    trainers: Path,
    exported: dict[str, Any],
    prepared: dict[str, Any],
    tokenizer_dir: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "prepared"
    shutil.copytree(prepared["out"], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # a length that drops some rows (prompt longer than it) and cuts others
    prompts = sorted(len(item["input_ids"]) for item in exported["records"].values())
    short = prompts[len(prompts) // 2]
    want, cut, dropped = expected_rows(exported["records"].values(), short)
    assert cut > 0 and dropped > 0
    data = ["prepare-data", "--data", str(exported["path"]), "--seq-length", str(short)]

    # without --overwrite: the old output stays, exit 0, one warning
    log = prepare(trainers, tokenizer_dir, data, out)
    assert "Dataset files already exist in output directory, skipping preprocessing" in log
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    # --overwrite: rebuilt, rows cut at --seq-length (warned), rows left unsupervised dropped
    # (warned); an existing token frequency file is reused as it is, not recounted
    freq = tmp_path / "token_freq.pt"
    shutil.copy(out / "token_freq.pt", freq)
    more = ["--overwrite", "--no-skip-token-freq", "--token-freq-path", str(freq)]
    log = prepare(trainers, tokenizer_dir, [*data, *more], out)
    assert prepared_rows(out)[0] == want
    assert logged(log, r"Dropped (\d+) rows with no supervised tokens") == dropped
    assert logged(log, rf"(\d+) rows may have been truncated .*\({short}\)") == cut
    assert "Reusing existing token frequency distribution" in log
    assert freq.read_bytes() == before["token_freq.pt"]


def test_speculators_reads_the_hf_export_through_its_hint(
    trainers: Path, exported: dict[str, Any], tokenizer_dir: str, tmp_path: Path
) -> None:
    report = exported["hf_report"]
    args = hint(report)
    assert args[:3] == ["prepare-data", "--data", f"hf:{report.output}"]
    log = prepare(trainers, tokenizer_dir, args, tmp_path / "prepared")
    assert "Speculator-format rows: using their loss mask, skipping render" in log
    got, _ = prepared_rows(tmp_path / "prepared")
    want, _, _ = expected_rows(exported["records"].values(), report.length_stats()["max"])
    assert got == want
    assert sum(got.values()) == report.exported
