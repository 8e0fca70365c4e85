"""Issue 3, item 7: the bad input table (invariant 5).

A bad row costs one failure entry with its reason and a one-line message, and the run goes on; a
bad dataset or config as a whole is one clear error naming the fix, before anything is sent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, TOKENIZER, make_config, read_failures, read_records, sim_config
from eagledata.config import load_config
from eagledata.errors import ConfigError, DatasetError
from eagledata.run import pipeline
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread

# bad_rows.jsonl (see its README): source line -> (failure row id, reason, message fragment)
BAD_ROWS = {
    2: ("#1", "bad_row", "line 2: malformed JSON"),
    4: ("#3", "bad_row", "line 4: malformed JSON"),
    5: ("bad-empty-conversations", "empty_conversation", "conversations is empty"),
    6: ("bad-no-known-field", "missing_field", "no conversations, messages or 'prompt' field"),
    7: ("bad-unknown-role", "unknown_role", "conversations[1].from: unknown role 'robot'"),
    8: ("bad-content-number", "bad_content", "conversations[0].value: content is int"),
    9: ("bad-content-list", "bad_content", "conversations[0].value: content is list"),
    10: ("bad-content-null", "bad_content", "conversations[0].value: content is missing"),
    11: ("bad-no-user-turn", "no_user_turn", "no user turn to answer"),
    12: ("bad-empty-prompt", "empty_prompt", "the last user turn is empty"),
    13: ("#12", "bad_row", "line 13: invalid UTF-8"),
    14: ("bad-too-long", "prompt_too_long", "limit of 4000 (generation.max_prompt_tokens)"),
}


@pytest.fixture(scope="module")
def bad_rows_run(
    tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Any, int]]:
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        out = tmp_path_factory.mktemp("bad") / "run"
        config = make_config([server.url], out, generation={"max_prompt_tokens": 4000})
        summary = pipeline.generate(config, str(SAMPLES / "bad_rows.jsonl"), None, progress=False)
        yield out, summary, server.stats()["requests"]


@pytest.mark.parametrize("line", sorted(BAD_ROWS))
def test_each_bad_row_is_one_failure_entry_with_its_reason(
    bad_rows_run: tuple[Path, Any, int], line: int
) -> None:
    out, _, _ = bad_rows_run
    row_id, reason, fragment = BAD_ROWS[line]
    entries = [f for f in read_failures(out) if f["row_id"] == row_id]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["reason"] == reason
    assert fragment in entry["message"] and "\n" not in entry["message"]
    assert entry["id"] == f"bad_rows/{row_id}/0" and entry["attempts"] == 0


def test_bad_rows_never_stop_the_run_and_are_never_sent(
    bad_rows_run: tuple[Path, Any, int],
) -> None:
    out, summary, requests = bad_rows_run
    assert sorted(r["row_id"] for r in read_records(out)) == ["good-001", "good-002", "good-003"]
    assert requests == 3
    assert summary.planned == 15 == summary.written + summary.failed + summary.skipped
    assert verify_run(out).ok


ODD_ROWS = [
    # (line, row id, reason, message fragment); a blank line (8) is no row, but counts as a line
    (
        '{"id": "m-role", "messages": [{"role": "robot", "content": "x"}]}',
        "m-role",
        "unknown_role",
        "messages[0].role: unknown role 'robot'",
    ),
    ('{"id": "m-str", "messages": "hello"}', "m-str", "bad_schema", "messages is str, not a list"),
    (
        '{"id": "m-turn", "messages": ["hello"]}',
        "m-turn",
        "bad_schema",
        "messages[0] is str, not an object",
    ),
    (
        '{"id": "m-list", "messages": [{"role": "user", "content": ["a", "b"]}]}',
        "m-list",
        "bad_content",
        "messages[0].content: content is list",
    ),
    (
        '{"id": "m-none", "messages": [{"role": "user"}]}',
        "m-none",
        "bad_content",
        "messages[0].content: content is missing",
    ),
    ('{"id": "p-int", "prompt": 42}', "p-int", "bad_content", "prompt: int, not a string"),
    (
        '{"id": "p-space", "prompt": " \\n\\t "}',
        "p-space",
        "empty_prompt",
        "the last user turn is empty",
    ),
    ("[1, 2, 3]", "#7", "bad_row", "line 9: expected a JSON object, got list"),
    ('"just a string"', "#8", "bad_row", "line 10: expected a JSON object, got str"),
    ('{"id": "ok", "prompt": "fine"}', "ok", None, None),
    (
        '{"id": "ok", "prompt": "the same id again"}',
        "ok@10",
        "duplicate_id",
        "row 10 repeats the id 'ok' of an earlier row",
    ),
]


def test_odd_rows_of_every_schema(sim: SimServerThread, tmp_path: Path) -> None:
    lines = [row[0] for row in ODD_ROWS[:7]] + [""] + [row[0] for row in ODD_ROWS[7:]]
    dataset = tmp_path / "odd.jsonl"
    dataset.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    summary = pipeline.generate(make_config([sim.url], out), str(dataset), None, progress=False)

    failures = {f["row_id"]: f for f in read_failures(out)}
    for _, row_id, reason, fragment in ODD_ROWS:
        if reason is None:
            continue
        assert failures[row_id]["reason"] == reason, row_id
        assert fragment in failures[row_id]["message"], failures[row_id]["message"]
    assert failures["ok@10"]["status"] == "skipped"
    assert [r["row_id"] for r in read_records(out)] == ["ok"]
    assert summary.written == 1 and summary.skipped == 1 and summary.failed == 9
    assert summary.left == 0 and verify_run(out).ok


# --- the dataset as a whole -------------------------------------------------------------------


def test_an_unknown_dataset_name_names_the_choices(sim: SimServerThread, tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(make_config([sim.url], tmp_path / "run"), "nosuch", None, progress=False)
    assert str(caught.value) == (
        "unknown dataset 'nosuch'; use a name from the config (none configured), a "
        ".jsonl/.json/.parquet path, or a hub id like org/name"
    )
    assert not (tmp_path / "run").exists() and sim.stats()["requests"] == 0


def test_a_missing_dataset_file(sim: SimServerThread, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(
            make_config([sim.url], tmp_path / "run"), str(missing), None, progress=False
        )
    assert str(caught.value) == f"dataset file {missing} not found; check the path or the name"


def test_a_dataset_of_an_unsupported_type(sim: SimServerThread, tmp_path: Path) -> None:
    text = tmp_path / "prompts.txt"
    text.write_text("hello\n")
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(make_config([sim.url], tmp_path / "run"), str(text), None, progress=False)
    assert str(caught.value) == (
        f"dataset file {text} has unsupported type '.txt'; use .jsonl, .json or .parquet"
    )


@pytest.mark.slow
def test_a_malformed_json_array_file(sim: SimServerThread, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('[{"prompt": "a"}, {"prompt": ')
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(
            make_config([sim.url], tmp_path / "run"), str(broken), None, progress=False
        )
    assert str(caught.value).startswith(f"cannot read dataset {broken}: ")
    assert "\n" not in str(caught.value)
    assert sim.stats()["requests"] == 0


def test_an_unreadable_dataset_file(sim: SimServerThread, tmp_path: Path) -> None:
    unreadable = tmp_path / "unreadable.jsonl"
    if os.geteuid() == 0:  # root reads a mode-000 file: an I/O error stands in for EACCES
        unreadable.symlink_to("/proc/self/mem")
    else:
        unreadable.write_text('{"prompt": "hi"}\n')
        unreadable.chmod(0)
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(
            make_config([sim.url], tmp_path / "run"), str(unreadable), None, progress=False
        )
    assert str(caught.value).startswith(f"cannot read dataset file {unreadable}: ")


def test_a_corrupt_parquet_file(sim: SimServerThread, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(
            make_config([sim.url], tmp_path / "run"), str(corrupt), None, progress=False
        )
    assert str(caught.value).startswith(f"cannot read dataset {corrupt}: ")


# --- the config ---------------------------------------------------------------------------------

BAD_VALUES = [
    (
        "[generation]\ntemperature = -1",
        "generation.temperature: Input should be greater than or equal to 0",
    ),
    ("[generation]\ntop_k = 0", "generation.top_k: top_k must be -1 (all) or >= 1"),
    ("[run]\nconcurrency = 0", "run.concurrency: must be 'auto' or an integer from 1 to 65536"),
    (
        '[run]\nshard_size = "big"',
        "run.shard_size: Input should be a valid integer, unable to parse string as an integer",
    ),
    (
        '[server]\nurls = ["localhost:30000"]',
        "server.urls: 'localhost:30000' is not an http(s) URL, e.g. http://localhost:30000",
    ),
    (
        "[server]\nmax_attempts = 0",
        "server.max_attempts: Input should be greater than or equal to 1",
    ),
    ("[run]\nbogus = 1", "run.bogus: unknown key"),
]


@pytest.mark.parametrize(("toml", "problem"), BAD_VALUES)
def test_a_bad_config_value_is_one_line_naming_its_key(
    tmp_path: Path, toml: str, problem: str
) -> None:
    path = tmp_path / "eagledata.toml"
    path.write_text(f'[tokenizer]\nname = "{TOKENIZER}"\n{toml}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: {problem}"


def test_a_config_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "eagledata.toml"
    path.write_text("[tokenizer\nname = 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: invalid TOML: ")


def test_records_never_hold_a_bad_rows_text(bad_rows_run: tuple[Path, Any, int]) -> None:
    """The failure file holds the reason, not the row: an invalid-UTF-8 row stays out of JSON."""
    out, _, _ = bad_rows_run
    raw = (out / "failures.jsonl").read_bytes()
    assert all(orjson.loads(line) for line in raw.splitlines())


# Run the CLI in this process and say its peak RSS (KiB) on the last line of stdout: VmHWM, the
# peak of this process's own memory since its exec (getrusage's ru_maxrss keeps the parent's
# from before the exec: a pytest grown large would count).
PEAK_RSS = """
import sys
sys.argv = ["eagledata", *sys.argv[1:]]
from eagledata.cli import main
try:
    main()
except SystemExit:
    pass
with open("/proc/self/status") as status:
    peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
print("peak", peak)
"""
HUGE_PROMPT_CHARS = 8 << 20


@pytest.mark.parametrize("turns", ["last", "all"])
def test_a_huge_prompt_is_refused_by_its_size_before_it_is_tokenized(
    tokenizer_dir: str, tmp_path: Path, turns: str
) -> None:
    """A 20 MB prompt was tokenized whole before its length was looked at: 3.1 GB at the peak.
    Now it is a failure line saying why, from its characters, and the run's memory stays near
    what a run of small prompts takes."""
    import subprocess
    import sys

    dataset = tmp_path / "rows.jsonl"
    text = "word " * (HUGE_PROMPT_CHARS // 5)
    huge = {"id": "huge", "conversations": [{"from": "human", "value": text}]}
    small = {"id": "small", "conversations": [{"from": "human", "value": "hello there"}]}
    dataset.write_bytes(orjson.dumps(small) + b"\n" + orjson.dumps(huge) + b"\n")
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        config = tmp_path / "eagledata.toml"
        config.write_text(
            f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{server.url}"]\n'
            f'[generation]\nmax_new_tokens = 16\nturns = "{turns}"\n'
            "[run]\nconcurrency = 2\n[canary]\nenabled = false\n"
        )
        out = tmp_path / "run"
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, "generate", "--config", str(config), "--dataset",
             str(dataset), "--out", str(out), "--no-progress"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    peak_kib = int(done.stdout.split()[-1])
    # a run of small prompts peaks near 150 MB; the 8 MB prompt adds its row, its string and
    # its messages (tokenized, it took ~1.2 GB)
    assert peak_kib < 400 * 1024, f"peak RSS {peak_kib / 1024:.0f} MB"
    failures = read_failures(out)
    assert [f["row_id"] for f in failures] == ["huge"], done.stderr
    assert failures[0]["reason"] == "prompt_too_long"
    assert failures[0]["message"] == (
        f"prompt has {len(text) + len('user'):,} characters, more than 32751 tokens can hold at "
        "32 a token (server context_length); not tokenized"
    )
    assert len(read_records(out)) == 1
