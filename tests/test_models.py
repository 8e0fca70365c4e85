"""Any target model: ``--model DIR|NAME`` gives a run its tokenizer, expected model and KV bytes
per token with no config file; ids in the embedding's padding are named as such."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import SAMPLES, read_failures, read_records
from conftest import run_cli as run_cli_here
from eagledata.cli.shell import load_app_config, server_settings
from eagledata.errors import ConfigError, ContractViolationError
from eagledata.profiles.target import resolve_target
from eagledata.server.responses import check_token_ids
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import evaluate_kv_guard, same_model
from eagledata.simserver import SimConfig, SimServerThread

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_VOCAB = 3000
"""The bundled tiny ChatML tokenizer's vocabulary, added tokens included."""

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "vocab_size": 3072,  # padded past the tokenizer's 3,000, as real models pad theirs
    "torch_dtype": "bfloat16",
}
TINY_LLAMA_BF16_BYTES = 2 * 2 * 2 * (128 // 4) * 2
"""K and V x 2 layers x 2 KV heads x head_dim 32 x 2 bytes = 512."""


def make_model_dir(folder: Path, tokenizer_dir: str, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(tokenizer_dir) / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def llama_dir(tmp_path: Path, tokenizer_dir: str) -> Path:
    return make_model_dir(tmp_path / "tiny-llama", tokenizer_dir, TINY_LLAMA)


def llama_sim(model_dir: Path, **overrides: Any) -> SimConfig:
    """The simulator with the tiny Llama's shapes: its path, tokenizer and KV cell, TP 1, a
    pool large enough for the guard to measure bytes per token."""
    fields: dict[str, Any] = {
        "model_path": str(model_dir),
        "tokenizer_path": str(model_dir),
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "kv_bytes_per_token": TINY_LLAMA_BF16_BYTES,
        "tp_size": 1,
        "max_total_num_tokens": 4_000_000,
        "context_length": 4096,
        "version": "0.5.23",
    }
    return SimConfig(**{**fields, **overrides})


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli_here(*args, cwd=cwd, env={"EAGLEDATA_CONFIG": None})


# --- the model's folder gives the settings ------------------------------------------------------


def test_a_model_folder_gives_tokenizer_expected_model_and_kv_bytes(llama_dir: Path) -> None:
    target = resolve_target(str(llama_dir))
    assert target.settings() == {
        "tokenizer.name": str(llama_dir.resolve()),
        "server.expected_model": str(llama_dir.resolve()),
        "server.bf16_kv_bytes_per_token": TINY_LLAMA_BF16_BYTES,
        "server.kv_heads": 2,
        # the bundled template's thinking switch (Qwen3's spelling), turned on
        "tokenizer.chat_template_kwargs": {"enable_thinking": True},
    }
    assert target.kv.kind == "GQA"
    assert target.embedding_rows == 3072


def test_generate_with_model_and_server_needs_no_config_file(
    llama_dir: Path, tmp_path: Path
) -> None:
    """From a folder with no configs/ (nothing to fall back on), ``--model DIR --server URL``
    runs against a server serving that model; failed on main ("no such option: --model")."""
    work = tmp_path / "work"
    work.mkdir()
    with SimServerThread(llama_sim(llama_dir)) as server:
        done = run_cli(
            "generate", "--model", str(llama_dir), "--server", server.url,
            "--dataset", str(SAMPLES / "sharegpt.jsonl"), "--out", "run", "--limit", "6",
            "--max-new-tokens", "24", "--no-canary", "--no-progress", cwd=work,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    frozen = json.loads((work / "run" / "run.json").read_text())["frozen"]
    assert frozen["tokenizer"]["name"] == str(llama_dir.resolve())
    assert frozen["expected_model"] == str(llama_dir.resolve())
    assert frozen["bf16_kv_bytes_per_token"] == TINY_LLAMA_BF16_BYTES
    assert frozen["kv_heads"] == 2
    assert len(read_records(work / "run")) == 6


def test_generate_refuses_a_server_serving_another_model(llama_dir: Path, tmp_path: Path) -> None:
    with SimServerThread(llama_sim(llama_dir, model_path="/models/other")) as server:
        done = run_cli(
            "generate", "--model", str(llama_dir), "--server", server.url,
            "--dataset", str(SAMPLES / "sharegpt.jsonl"), "--out", "run", "--limit", "2",
            "--no-canary", "--no-progress", cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 4
    assert "server serves '/models/other'" in done.stderr


def test_a_config_file_wins_over_the_model_and_a_flag_over_both(
    llama_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "mine.toml"
    config.write_text(
        '[server]\nexpected_model = "served-name"\nbf16_kv_bytes_per_token = 1000\n'
        "[generation]\nmax_new_tokens = 77\n"
    )
    loaded = load_app_config(config, {}, str(llama_dir))
    assert loaded.server.expected_model == "served-name"  # the file's
    assert loaded.server.bf16_kv_bytes_per_token == 1000  # the file's
    assert loaded.server.kv_heads == 2  # the model's: the file does not set it
    assert loaded.tokenizer.name == str(llama_dir.resolve())  # the model's
    flagged = load_app_config(config, {"tokenizer.name": "bundled:tokenizer/tiny-chatml"}, None)
    assert flagged.tokenizer.name == "bundled:tokenizer/tiny-chatml"
    assert server_settings(config, str(llama_dir)).expected_model == "served-name"


def test_with_model_and_no_config_named_the_reference_config_is_not_read(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped config is the Kimi-K2.5 job's: its thinking switch and expected model must
    not leak into another model's run."""
    monkeypatch.delenv("EAGLEDATA_CONFIG", raising=False)
    loaded = load_app_config(None, {}, str(llama_dir))
    assert loaded.tokenizer.chat_template_kwargs == {"enable_thinking": True}  # not Kimi's
    assert loaded.server.expected_model == str(llama_dir.resolve())
    assert not loaded.server.simulated.enabled


def test_a_hub_name_is_found_in_the_local_cache_only(
    tmp_path: Path, tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-llama"
    revision = "0123456789abcdef0123456789abcdef01234567"
    make_model_dir(repo / "snapshots" / revision, tokenizer_dir, TINY_LLAMA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    target = resolve_target("acme/tiny-llama")
    assert target.path == repo / "snapshots" / revision
    assert target.expected_model == "acme/tiny-llama"
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        resolve_target("acme/not-downloaded")
    assert time.monotonic() - started < 2  # no retries, no network
    message = str(refused.value)
    assert "\n" not in message
    assert "huggingface-cli download acme/not-downloaded" in message


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ("./nowhere", "no such folder"),
        ("config.json", "not a folder"),
    ],
)
def test_a_bad_model_is_one_line_naming_the_fix(
    given: str, fix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=fix):
        resolve_target(given)


def test_a_folder_without_tokenizer_files_names_the_fix(tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    with pytest.raises(ConfigError, match=r"no tokenizer files.*--tokenizer DIR"):
        resolve_target(str(folder))


# --- the server's model_path and its KV cell ---------------------------------------------------


@pytest.mark.parametrize(
    ("served", "expected", "same"),
    [
        ("/models/tiny-llama", "/models/tiny-llama/", True),
        ("tiny-llama", "/models/tiny-llama", True),  # launched from /models with a relative path
        ("./models/tiny-llama", "/srv/models/tiny-llama", True),
        ("other", "/models/tiny-llama", False),
        ("/elsewhere/tiny-llama", "/models/tiny-llama", False),
        ("../tiny-llama", "/models/tiny-llama", False),
        ("acme/tiny-llama", "acme/tiny-llama", True),
        ("/hf/hub/models--acme--tiny-llama/snapshots/0123abc", "acme/tiny-llama", True),
        ("/hf/hub/models--acme--other/snapshots/0123abc", "acme/tiny-llama", False),
    ],
)
def test_the_served_model_path_is_compared_sensibly(served: str, expected: str, same: bool) -> None:
    assert same_model(served, expected) is same


def _facts(tp: int, bytes_per_token: int, **top: Any) -> ServerFacts:
    tokens = 4_000_000
    return ServerFacts.from_server_info(
        {
            "kv_cache_dtype": "bf16",
            "model_path": "/m",
            "tp_size": tp,
            "version": "0.5.23",
            "max_total_num_tokens": tokens,
            **top,
            "internal_states": [
                {
                    "kv_cache_dtype": "bf16",
                    "memory_usage": {
                        "kvcache": round(tokens * bytes_per_token / 2**30, 2),
                        "token_capacity": tokens,
                    },
                }
            ],
        }
    )


@pytest.mark.parametrize(
    ("tp", "per_rank", "ok"),
    [
        (1, 512, True),
        (2, 256, True),  # 1 of 2 KV heads per rank
        (4, 256, True),  # fewer heads than ranks: each keeps one (replicated)
        (2, 512, False),  # TP 2 holding every head: not this model's layout
        (1, 256, False),  # half the bytes: fp8
    ],
)
def test_the_guard_splits_an_mha_cell_over_the_servers_tp(tp: int, per_rank: int, ok: bool) -> None:
    verdict = evaluate_kv_guard(
        _facts(tp, per_rank), expected_model=None, bf16_bytes_per_token=512, kv_heads=2
    )
    assert verdict.ok is ok, verdict.problems


def test_an_mla_cell_is_whole_on_every_rank() -> None:
    whole = evaluate_kv_guard(_facts(8, 70_272), expected_model=None, bf16_bytes_per_token=70_272)
    assert whole.ok
    halved = evaluate_kv_guard(_facts(8, 35_136), expected_model=None, bf16_bytes_per_token=70_272)
    assert not halved.ok


def test_dp_attention_splits_heads_over_the_attention_tp_only() -> None:
    # TP 8 with 4 attention-DP ranks: attention TP 2, so 8 KV heads keep 4 per rank
    facts = _facts(8, 4 * 1024, attn_dp_size=4)
    assert facts.attn_tp_size == 2
    verdict = evaluate_kv_guard(
        facts, expected_model=None, bf16_bytes_per_token=8 * 1024, kv_heads=8
    )
    assert verdict.ok, verdict.problems


# --- the chat template ------------------------------------------------------------------------


def without_template(folder: Path) -> Path:
    """``folder``'s tokenizer with its chat template taken out (a base model's)."""
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    template = config.pop("chat_template")
    config_file.write_text(json.dumps(config))
    return Path(str(template))  # the text, for tests that put it back elsewhere


def test_a_model_without_a_chat_template_is_refused_naming_the_fix(
    llama_dir: Path, tmp_path: Path
) -> None:
    template = str(without_template(llama_dir))
    dataset = str(SAMPLES / "sharegpt.jsonl")
    with SimServerThread(llama_sim(llama_dir)) as server:
        refused = run_cli(
            "generate", "--model", str(llama_dir), "--server", server.url, "--dataset", dataset,
            "--out", "run", "--limit", "2", "--no-canary", "--no-progress", cwd=tmp_path,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line
        assert "has no chat template" in line
        assert "--chat-template FILE" in line and "[tokenizer] chat_template" in line
        (tmp_path / "chatml.jinja").write_text(template)
        fixed = run_cli(
            "generate", "--model", str(llama_dir), "--server", server.url, "--dataset", dataset,
            "--chat-template", "chatml.jinja", "--out", "run2", "--limit", "2",
            "--max-new-tokens", "16", "--no-canary", "--no-progress", cwd=tmp_path,
        )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr
    frozen = json.loads((tmp_path / "run2" / "run.json").read_text())["frozen"]
    assert frozen["tokenizer"]["chat_template"] == template
    assert len(read_records(tmp_path / "run2")) == 2


def test_the_models_chat_template_jinja_file_is_its_template(llama_dir: Path) -> None:
    from eagledata.config import TokenizerSettings
    from eagledata.source.tokenization import PromptTokenizer

    template = str(without_template(llama_dir))
    (llama_dir / "chat_template.jinja").write_text(template)
    target = resolve_target(str(llama_dir))
    assert target.chat_template == template
    tokenizer = PromptTokenizer(TokenizerSettings(name=str(llama_dir)))
    ids = tokenizer.encode([{"role": "user", "content": "hi"}])
    assert tokenizer.hf.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("template", "switch"),
    [
        # Kimi-K2.5's and DeepSeek-V3.1's spelling
        (
            "{%- if thinking is defined and thinking is false -%}<think></think>{%- endif -%}",
            "thinking",
        ),
        ("{% if enable_thinking is false %}<think>\n\n</think>{% endif %}", "enable_thinking"),
        ("{{ 'thinking about it' }}<think>", None),  # the word in the text, not a variable
        ("{{ messages[0].content }}", None),
    ],
)
def test_the_thinking_switch_is_read_from_the_template(
    template: str, switch: str | None, llama_dir: Path
) -> None:
    without_template(llama_dir)
    (llama_dir / "chat_template.jinja").write_text(template)
    target = resolve_target(str(llama_dir))
    assert target.thinking_switch == switch
    kwargs = target.settings().get("tokenizer.chat_template_kwargs")
    assert kwargs == ({switch: True} if switch else None)


def test_a_run_made_before_the_later_settings_keeps_its_fingerprint() -> None:
    """kv_heads, tokenizer.chat_template and generation.round were added after runs were made:
    unset (round 0), they are not part of the fingerprint, so resume adopts the records those
    runs wrote."""
    import hashlib

    import orjson

    from eagledata.config import DatasetSettings, FrozenSettings, TokenizerSettings
    from eagledata.config.data import GenerationSettings

    frozen = FrozenSettings(
        dataset_name="d",
        dataset=DatasetSettings(source="x.jsonl"),
        tokenizer=TokenizerSettings(name="t"),
        generation=GenerationSettings(),
        limit=None,
        shard_size=10,
        expected_model="m",
        bf16_kv_bytes_per_token=512,
    )
    dumped = frozen.model_dump(mode="json", by_alias=True)
    del dumped["kv_heads"]
    del dumped["tokenizer"]["chat_template"]
    del dumped["generation"]["round"]
    earlier = hashlib.sha256(orjson.dumps(dumped, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    assert frozen.fingerprint() == earlier
    assert frozen.model_copy(update={"kv_heads": 2}).fingerprint() != earlier


# --- ids in the embedding's padding ---------------------------------------------------------


def test_an_id_in_the_embedding_padding_is_named_as_such() -> None:
    ids = [5] * 76 + [3009]
    with pytest.raises(ContractViolationError) as padded:
        check_token_ids(ids, 3000, embedding_rows=3072)
    assert padded.value.reason == "padding_id"
    assert str(padded.value) == (
        "output_ids[76] is 3009: a padding row of the model's embedding (vocab_size 3072) past "
        "the tokenizer's 3000 tokens; it has no text: the model is not trained or the server is "
        "misconfigured"
    )
    with pytest.raises(ContractViolationError) as outside:
        check_token_ids([5, 4000], 3000, embedding_rows=3072)
    assert outside.value.reason == "contract_violation"
    assert "outside the model's embedding (vocab_size 3072)" in str(outside.value)
    with pytest.raises(ContractViolationError, match=r"outside the tokenizer's vocabulary"):
        check_token_ids([3009], 3000)  # the embedding unknown: as before


def test_a_run_names_padding_ids_in_its_failures(llama_dir: Path, tmp_path: Path) -> None:
    """A server sampling from an embedding of 3,072 rows over a tokenizer of 3,000 (random
    weights do): each answer that holds a padding id is an item failure saying so, the others
    are records, and the run ends normally."""
    # no tokenizer on the simulator: it samples ids uniformly from its whole vocabulary
    sim = llama_sim(llama_dir, tokenizer_path=None, vocab_size=3072, eos_token_id=2)
    with SimServerThread(sim) as server:
        done = run_cli(
            "generate", "--model", str(llama_dir), "--server", server.url,
            "--dataset", str(SAMPLES / "sharegpt.jsonl"), "--out", "run", "--limit", "20",
            "--max-new-tokens", "48", "--no-canary", "--no-progress", cwd=tmp_path,
        )  # fmt: skip
    failures = read_failures(tmp_path / "run")
    padded = [f for f in failures if f["reason"] == "padding_id"]
    assert padded, (done.returncode, done.stderr, failures[:2])
    assert "a padding row of the model's embedding (vocab_size 3072)" in padded[0]["message"]
    for record in read_records(tmp_path / "run"):
        assert max(record["output_ids"]) < TOKENIZER_VOCAB


# --- plan --model M --rig R, launch-server --model M ----------------------------------------------


FIXTURES = Path(__file__).with_name("fixtures") / "models"


def fixture_model(name: str, tmp_path: Path, tokenizer_dir: str) -> Path:
    """A fixture's config.json with a tokenizer beside it: a model folder without weights."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(FIXTURES / name / "config.json", folder / "config.json")
    shutil.copy(Path(tokenizer_dir) / "tokenizer.json", folder / "tokenizer.json")
    return folder


def plan_json(*args: str, cwd: Path) -> dict[str, Any]:
    done = run_cli("plan", "--json", *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


@pytest.mark.parametrize(
    ("model", "kind", "cell_tp8"),
    [
        ("llama-3.1-8b", "GQA", 16_384),
        ("qwen3-30b-a3b", "GQA", 24_576),  # 4 KV heads over 8 ranks: one each, replicated
        ("deepseek-v3", "MLA", 70_272),
        ("gpt-oss-120b", "GQA + sliding window 128", 8_295),  # 8,294.4 rounded up
    ],
)
def test_plan_with_a_model_derives_its_layouts_and_says_its_attention(
    model: str, kind: str, cell_tp8: int, tmp_path: Path, tokenizer_dir: str
) -> None:
    folder = fixture_model(model, tmp_path, tokenizer_dir)
    document = plan_json("--model", str(folder), "--rig", "h200x8", cwd=tmp_path)
    rows = {row["profile"]: row for row in document["profiles"]}
    tp8 = rows[f"{model}-tp8"]
    assert tp8["starts"]
    assert tp8["attention"].startswith(kind)
    assert kind in tp8["status_text"]
    assert f"{cell_tp8:,} B per KV token per rank" in tp8["status_text"]
    assert tp8["cell_bytes"] == cell_tp8
    assert any(a.startswith("weights ") for a in tp8["assumptions"])
    assert all(row["evidence"] == "unverified" for row in rows.values())
    # DP attention only where SGLang serves it: MLA models
    assert any("DPA" in row["parallelism"] for row in rows.values()) is (kind == "MLA")


def test_plan_says_when_the_weights_do_not_fit_the_rig(tmp_path: Path, tokenizer_dir: str) -> None:
    """DeepSeek-V3's fp8 weights (~627 GiB) leave nothing for KV on 8x 80 GB: no layout starts,
    and the row says why."""
    folder = fixture_model("deepseek-v3", tmp_path, tokenizer_dir)
    document = plan_json("--model", str(folder), "--rig", "h100x8", cwd=tmp_path)
    assert document["profiles"]
    assert not any(row["starts"] for row in document["profiles"])
    assert "Not enough memory" in document["profiles"][0]["notes"][0]


def test_kimi_derived_from_its_config_matches_the_fitted_profile(
    tmp_path: Path, tokenizer_dir: str
) -> None:
    """The same code on Kimi-K2.5's config: the same KV cell, and at TP8 the weights within 1.3%
    of the 72.53 GiB the reference runs fitted (the vision tower, ~0.93 GiB there, is not in
    the count); the hand-written profiles keep the fitted figure, and with it 115,988 tokens."""
    from eagledata.capacity.derived import derived_profile
    from eagledata.profiles.kv import KIMI_K25_BF16_BYTES_PER_TOKEN
    from eagledata.profiles.loading import load_profile
    from eagledata.profiles.rigs import reference_rig

    folder = fixture_model("kimi-k2.5", tmp_path, tokenizer_dir)
    target = resolve_target(str(folder))
    assert target.kv.bf16_bytes_per_token == KIMI_K25_BF16_BYTES_PER_TOKEN
    derived = derived_profile(target, reference_rig(), 8)
    fitted = load_profile("kimi-k25-reference-bf16", FIXTURES.parents[2] / "configs" / "profiles")
    assert derived.model.resident_gib == pytest.approx(fitted.model.resident_gib, rel=0.013)
    vision_gib = 0.93
    assert derived.model.resident_gib + vision_gib == pytest.approx(
        fitted.model.resident_gib, rel=0.001
    )


def test_launch_server_with_a_model_renders_its_command(tmp_path: Path, tokenizer_dir: str) -> None:
    folder = fixture_model("deepseek-v3", tmp_path, tokenizer_dir)
    done = run_cli(
        "launch-server", "--model", str(folder), "--tp", "8", "--dp-attention", "4",
        "--dry-run", "--sglang-version", "0.5.23", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = done.stdout.split()
    assert argv[argv.index("--model-path") + 1] == str(folder.resolve())
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--attn-dp-size") + 1] == "4"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "bf16"
    refused = run_cli(
        "launch-server", "--model", str(folder), "--tp", "3", "--dry-run", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "--tp 3" in refused.stderr and "dividing the attention heads" in refused.stderr


def test_weights_no_node_holds_are_planned_over_every_node(
    tmp_path: Path, tokenizer_dir: str
) -> None:
    """On two nodes of 8x 80 GB no TP8 layout holds DeepSeek-V3's weights; one TP16 server over
    both nodes does, and the plan says how to launch it."""
    folder = fixture_model("deepseek-v3", tmp_path, tokenizer_dir)
    document = plan_json("--model", str(folder), "--rig", "h100x16", cwd=tmp_path)
    rows = {row["profile"]: row for row in document["profiles"]}
    assert not rows["deepseek-v3-tp8"]["starts"]
    tp16 = rows["deepseek-v3-tp16"]
    assert tp16["starts"] and tp16["nodes"] == 2
    assert "--tp 16 --nnodes 2" in tp16["settle"]
