"""The shipped tiny model folders agree with the repo's tokenizer and with each other.

The model (``assets/model``, built by ``scripts/build_tiny_model.py``) is what the tests against a
real server load; a tokenizer rebuilt without retraining the model, or a padded folder whose
weights drifted from the unpadded one, would make those tests measure something else. Read
without torch: the safetensors header and the raw bytes of each tensor.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from eagledata.config.loading import resolve_bundled

MODEL = Path(resolve_bundled("bundled:model/tiny-llama-chatml"))
PADDED = Path(resolve_bundled("bundled:model/tiny-llama-chatml-padded"))
TOKENIZER = Path(resolve_bundled("bundled:tokenizer/tiny-chatml"))
EMBEDDING = "model.embed_tokens.weight"


def _tensors(folder: Path) -> tuple[dict[str, Any], bytes]:
    """The safetensors header (name -> dtype, shape, offsets) and the data that follows it."""
    raw = (folder / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    return header, raw[8 + length :]


def _bytes(folder: Path) -> dict[str, bytes]:
    header, data = _tensors(folder)
    return {name: data[slice(*entry["data_offsets"])] for name, entry in header.items()}


def _config(folder: Path, name: str = "config.json") -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / name).read_text())
    return loaded


@pytest.mark.parametrize("folder", [MODEL, PADDED], ids=lambda p: p.name)
def test_the_folder_is_a_chat_model_whose_eos_is_im_end(folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = _config(folder)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (
        config["eos_token_id"]
        == im_end
        == _config(folder, "generation_config.json")["eos_token_id"]
    )
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query
    assert config["max_position_embeddings"] >= 2048 and config["tie_word_embeddings"]
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (folder / name).read_bytes() == (TOKENIZER / name).read_bytes(), name
    header, _ = _tensors(folder)
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    assert header[EMBEDDING]["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert "lm_head.weight" not in header  # tied: the embedding is the output layer
    assert (folder / "model.safetensors").stat().st_size < 4_000_000  # shipped in the wheel


def test_one_folder_matches_the_tokenizer_and_the_other_pads_it() -> None:
    vocab = len(AutoTokenizer.from_pretrained(TOKENIZER))
    assert _config(MODEL)["vocab_size"] == vocab
    padded_vocab = _config(PADDED)["vocab_size"]
    assert padded_vocab > vocab and padded_vocab % 128 == 0
    assert {k: v for k, v in _config(MODEL).items() if k != "vocab_size"} == {
        k: v for k, v in _config(PADDED).items() if k != "vocab_size"
    }


def test_the_padded_folder_holds_the_same_weights_plus_the_padding_rows() -> None:
    exact, padded = _bytes(MODEL), _bytes(PADDED)
    assert exact.keys() == padded.keys()
    for name, data in exact.items():
        if name == EMBEDDING:
            assert padded[name][: len(data)] == data
            assert len(padded[name]) > len(data)
        else:
            assert padded[name] == data, name
