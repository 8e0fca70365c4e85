"""One token's KV cell, as eagledata computes it from a ``config.json``, equals SGLang 0.5.23's own
arithmetic for the same config: its ``ModelConfig``, layer count and pool configurator, run on
this CPU machine by ``tests/sglang_probe.py`` (``tests/sglangkit.py`` builds the release); and
``plan --model`` plans every layout it derives with that same cell.

The fixtures in ``tests/fixtures/models/`` are the ``config.json`` files (configs only, no
weights) of four attention layouts: GQA (Llama-3.1-8B), GQA with a head_dim of its own and fewer
KV heads than an 8-way TP (Qwen3-30B-A3B), MLA (DeepSeek-V3; Kimi-K2.5's text backbone has the
same latent) and a sliding-window hybrid with two pools (GPT-OSS-120B).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import sglangkit
from eagledata.profiles.kv import KVModel
from eagledata.profiles.releases import get_release

pytestmark = pytest.mark.slow  # SGLang 0.5.23's own code, run in the release's environment

FIXTURES = Path(__file__).with_name("fixtures") / "models"
MODELS = ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b")

CASES: dict[str, dict[str, Any]] = {
    f"{model}-tp{tp}": {"model": model, "tp": tp} for model in MODELS for tp in (1, 2, 4, 8)
}
CASES["llama-3.1-8b-tp8-dcp2"] = {"model": "llama-3.1-8b", "tp": 8, "dcp": 2}
CASES["gpt-oss-120b-tp1-swa-ratio-0.5"] = {
    "model": "gpt-oss-120b",
    "tp": 1,
    "swa_full_tokens_ratio": 0.5,
}

EXPECTED_BF16_TP1 = {
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2,  # K+V x layers x KV heads x head_dim x 2 B = 131,072
    "qwen3-30b-a3b": 2 * 48 * 4 * 128 * 2,  # head_dim 128 from config, not 2048 / 32 = 64
    "deepseek-v3": (512 + 64) * 61 * 2,  # 70,272: Kimi-K2.5's too
    # 18 full layers + 0.8 x 18 sliding-window layers, each 2 x 8 heads x 64 x 2 B
    "gpt-oss-120b": 18 * 2048 + 0.8 * 18 * 2048,
}


def config(model: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / model / "config.json").read_text())
    return loaded


def eagledata_cell(case: dict[str, Any]) -> float:
    kv = KVModel.from_config(config(case["model"]), name=case["model"])
    return kv.cell_size(
        "bf16",
        attn_tp_size=case["tp"],
        dcp_size=case.get("dcp", 1),
        swa_full_tokens_ratio=case.get("swa_full_tokens_ratio", 0.8),
    )


@pytest.fixture(scope="module")
def sglang_cells() -> dict[str, Any]:
    release = get_release("0.5.23")
    assert release is not None
    job = {name: {**case, "config": config(case["model"])} for name, case in CASES.items()}
    cells: dict[str, Any] = sglangkit.probe(release, {"kv_cells": job})["kv_cells"]
    return cells


@pytest.mark.parametrize("model", MODELS)
def test_the_bf16_cell_at_tp1_is_the_layout_arithmetic(model: str) -> None:
    assert eagledata_cell({"model": model, "tp": 1}) == pytest.approx(EXPECTED_BF16_TP1[model])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cell_equals_sglangs_own(name: str, sglang_cells: dict[str, Any]) -> None:
    theirs = sglang_cells[name]
    assert "error" not in theirs, theirs.get("traceback")
    assert eagledata_cell(CASES[name]) == pytest.approx(theirs["cell_size"], rel=1e-12)
    kv = KVModel.from_config(config(CASES[name]["model"]))
    assert (kv.attention == "mla") == (theirs["attention_arch"] == "MLA")
    assert kv.hybrid == (theirs["configurator"] == "HybridSWAPoolConfigurator")
    if kv.hybrid:
        assert (kv.num_layers, kv.swa_layers) == (theirs["full_layers"], theirs["swa_layers"])
    else:
        assert kv.num_layers == theirs["layers"]


@pytest.mark.parametrize("model", MODELS)
def test_plan_with_the_model_uses_sglangs_cell(
    model: str, sglang_cells: dict[str, Any], tmp_path: Path, tokenizer_dir: str
) -> None:
    """``plan --model`` on each fixture: every derived row's bytes per token is SGLang's cell at
    that row's attention TP (a hybrid's fraction rounded up to whole bytes)."""
    import math
    import shutil

    from eagledata.capacity import REFERENCE_WORKLOAD
    from eagledata.capacity.derived import derive_profiles
    from eagledata.capacity.planner import plan_profiles
    from eagledata.profiles.rigs import get_rig
    from eagledata.profiles.target import resolve_target

    folder = tmp_path / model
    folder.mkdir()
    shutil.copy(FIXTURES / model / "config.json", folder)
    shutil.copy(Path(tokenizer_dir) / "tokenizer.json", folder)
    rig = get_rig("h200x8")
    profiles = derive_profiles(resolve_target(str(folder)), rig)
    checked = 0
    rows = plan_profiles(profiles, REFERENCE_WORKLOAD, rig=rig)
    for profile, row in zip(profiles, rows, strict=True):
        attn_tp = profile.tp_size // (profile.dp_size if profile.enable_dp_attention else 1)
        theirs = sglang_cells.get(f"{model}-tp{attn_tp}")
        if theirs is None:
            continue
        assert row.cell_bytes == math.ceil(theirs["cell_size"]), profile.name
        checked += 1
    assert checked >= 2
