"""Fail fast, in the right order (issue 11): the cheap checks before the expensive loads.

A local dataset file that is not there is reported before the tokenizer is loaded, the run
directory created or a server contacted; a server of another model is refused with the setting
that asked for the model (``server.expected_model``, in which file) and how to change it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SAMPLES, TOKENIZER, sim_config
from eagledata.config import load_config
from eagledata.errors import DatasetError, ServerRefusedError
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread
from eagledata.source.tokenization import PromptTokenizer

DATASET = str(SAMPLES / "sharegpt.jsonl")


def write_config(path: Path, url: str, source: str, expected_model: str = "") -> Path:
    lines = [
        "[tokenizer]",
        f'name = "{TOKENIZER}"',
        "[generation]",
        "max_new_tokens = 16",
        "[server]",
        f'urls = ["{url}"]',
        "guard_interval_s = 0.2",
        *([f'expected_model = "{expected_model}"'] if expected_model else []),
        "[datasets.b2]",
        f'source = "{source}"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_missing_dataset_file_is_reported_before_the_tokenizer_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_tokenizer(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer was loaded before the dataset was checked")

    monkeypatch.setattr(PromptTokenizer, "__init__", no_tokenizer)
    monkeypatch.chdir(tmp_path)
    config_path = write_config(tmp_path / "c.toml", "http://127.0.0.1:9", "data/b2.jsonl")
    out = tmp_path / "run"
    with pytest.raises(DatasetError) as caught:
        pipeline.generate(load_config(config_path), "b2", out, progress=False)
    assert str(caught.value) == (
        f"dataset b2: file data/b2.jsonl not found (relative to {tmp_path}); put the file there "
        f"or set datasets.b2.source in {config_path} to its path"
    )
    assert not out.exists()


def test_another_model_is_refused_naming_the_setting_and_its_file(
    tmp_path: Path, tokenizer_dir: str
) -> None:
    with SimServerThread(sim_config(tokenizer_dir, model_path="deepseek-ai/DeepSeek-V3")) as sim:
        config_path = write_config(tmp_path / "c.toml", sim.url, DATASET, "moonshotai/Kimi-K2.5")
        with pytest.raises(ServerRefusedError) as caught:
            pipeline.generate(load_config(config_path), "b2", tmp_path / "run", progress=False)
    assert str(caught.value) == (
        f"{sim.url} refused: server serves 'deepseek-ai/DeepSeek-V3', expected "
        "'moonshotai/Kimi-K2.5'; server.expected_model is 'moonshotai/Kimi-K2.5', in "
        f"{config_path}. Fix: serve moonshotai/Kimi-K2.5, or change server.expected_model in "
        f"{config_path} (or pass --config)"
    )
    assert caught.value.exit_code == 4


@pytest.mark.slow
def test_resume_against_another_model_says_the_model_is_frozen(
    tmp_path: Path, tokenizer_dir: str
) -> None:
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config_path = write_config(tmp_path / "c.toml", sim.url, DATASET, "moonshotai/Kimi-K2.5")
        config = load_config(config_path).model_copy(
            update={"run": load_config(config_path).run.model_copy(update={"limit": 3})}
        )
        pipeline.generate(config, "b2", out, progress=False)
    (out / "plan.json").unlink()  # pretend the run stopped early: resume has work to do
    with (
        SimServerThread(sim_config(tokenizer_dir, model_path="other/model")) as other,
        pytest.raises(ServerRefusedError) as caught,
    ):
        pipeline.resume(out, server_urls=[other.url], progress=False)
    assert str(caught.value).endswith(
        f"server.expected_model is 'moonshotai/Kimi-K2.5', frozen in {out}/run.json when the "
        "run started. Fix: point --server at a server of moonshotai/Kimi-K2.5, or start a new "
        "run with --out"
    )
