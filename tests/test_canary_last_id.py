"""The vocabulary's last id in a scoring: SGLang reports it as 0 in ``input_token_logprobs``
(``x if x < vocab_size - 1 else 0``, ``vocab_size`` the model config's: its embedding rows), in
every supported release. The simulator says what the real server says, and the canary reads it
as that substitution and nothing looser: a healthy server is not called unfaithful, any other id
that differs still is."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import sim_config
from eagledata.quality.canary_baseline import CanarySet
from eagledata.quality.canary_scorer import CanaryScorer, Measured, token_mismatch
from eagledata.server.client import SGLangClient
from eagledata.simserver import SimServerThread

RELEASES = ("0.5.9", "0.5.15.post1", "0.5.23")
VOCAB = 3000
"""The bundled tiny-chatml tokenizer's size, added tokens included: the simulator's vocabulary
when it is given no other."""
LAST = VOCAB - 1


def scoring_body(prompt: list[int], reference: list[int]) -> dict[str, Any]:
    return {
        "input_ids": prompt + reference,
        "return_logprob": True,
        "logprob_start_len": len(prompt) - 1,
        "top_logprobs_num": 5,
        "sampling_params": {"max_new_tokens": 0},
    }


PROMPT = [100 + j for j in range(30)]
REFERENCE = [200, LAST, 201, 202, LAST, LAST, 203, 0, 204, LAST - 1]


@pytest.mark.parametrize("version", RELEASES)
def test_the_simulator_reports_the_last_id_as_0_in_input_logprobs_only(
    tokenizer_dir: str, version: str
) -> None:
    """Input triples: the last id reads 0 (the one before it, and 0 itself, as they are), the
    logprob still the last id's own. The top-k lists and the output triples carry real ids."""
    config = sim_config(tokenizer_dir, version=version)
    with SimServerThread(config) as sim, httpx.Client(timeout=10) as http:
        scored = http.post(sim.url + "/generate", json=scoring_body(PROMPT, REFERENCE)).json()
        tail = [LAST, 300, LAST]
        greedy = http.post(
            sim.url + "/generate",
            json={
                "input_ids": PROMPT + tail,
                "return_logprob": True,
                "logprob_start_len": len(PROMPT),
                "top_logprobs_num": 20,
                "sampling_params": {"max_new_tokens": 8, "temperature": 0.0},
            },
        ).json()
    triples = scored["meta_info"]["input_token_logprobs"]
    assert triples[0] == [None, PROMPT[-1], None]
    expected = [0 if token == LAST else token for token in REFERENCE]
    assert [t[1] for t in triples[1:]] == expected
    assert all(isinstance(t[0], float) for t in triples[1:])
    # entry 0 of the scored region is clipped too when it is the last id
    head = greedy["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in head] == [0, 300, 0]
    assert head[0][0] is None
    # top-k ids come from the model's logits: real ids, the last one included where it is there
    tops = scored["meta_info"]["input_top_logprobs"]
    assert tops[0] is None
    assert any(entry[1] == LAST for row in tops[1:] for entry in row)
    out = greedy["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in out] == greedy["output_ids"]


def _score(url: str, canary: CanarySet, vocab_rows: int | None = None) -> Measured:
    async def main() -> Measured:
        async with SGLangClient([url], in_flight=8, vocab_size=VOCAB) as client:
            return await CanaryScorer(client, vocab_rows=vocab_rows).score(url, canary)

    return asyncio.run(main())


@pytest.mark.parametrize("version", RELEASES)
def test_a_healthy_server_scoring_the_last_id_is_faithful(tokenizer_dir: str, version: str) -> None:
    """References holding the last id (as the default canary's 12,288 tokens nearly always do on
    a model whose last id is an ordinary token): no mismatch, every position scored."""
    references = [
        ([100 + 7 * i + j for j in range(30)], [LAST if k % 5 == i else 150 + k for k in range(20)])
        for i in range(4)
    ]
    canary = CanarySet(references, [], top_k=5, probe_tokens=8)
    with SimServerThread(sim_config(tokenizer_dir, version=version)) as sim:
        measured = _score(sim.url, canary)
    assert measured.mismatch is None
    assert measured.scoring.lps.shape == (80,)
    assert measured.cold == 0


def test_the_scorer_accepts_exactly_the_last_id_read_as_0() -> None:
    reference = [5, LAST, 7, LAST]
    assert token_mismatch([5, 0, 7, 0], reference, LAST) is None
    assert token_mismatch([5, LAST, 7, LAST], reference, LAST) is None  # a server without it
    # any other id read as 0 is a mismatch; so is the last id read as anything but 0 or itself
    assert token_mismatch([0, 0, 7, 0], reference, LAST) == (
        "token mismatch: scored id 0 where the reference has 5 (position 0)"
    )
    assert token_mismatch([5, 1, 7, 0], reference, LAST) == (
        f"token mismatch: scored id 1 where the reference has {LAST} (position 1)"
    )
    # a model whose embedding has more rows than its tokenizer: the tokenizer's last id is not
    # the model's, and reads as itself
    assert token_mismatch([5, 0, 7, LAST], reference, LAST + 24) == (
        f"token mismatch: scored id 0 where the reference has {LAST} (position 1)"
    )
    assert token_mismatch([5, 0, 7], reference, LAST) == (
        "token mismatch: 3 ids scored for 4 reference tokens"
    )


def test_a_padded_embedding_reports_the_tokenizers_last_id_as_itself(tokenizer_dir: str) -> None:
    """An embedding 24 rows past the tokenizer (as real models pad theirs): the quirk touches id
    3023 only, which no reference holds, and the scorer told the rows accepts no 0 for 2999."""
    references = [([100 + j for j in range(30)], [LAST, 150, LAST, 151])]
    canary = CanarySet(references, [], top_k=5, probe_tokens=8)
    with SimServerThread(sim_config(tokenizer_dir, vocab_size=VOCAB + 24)) as sim:
        with httpx.Client(timeout=10) as http:
            body = scoring_body(*references[0])
            triples = http.post(sim.url + "/generate", json=body).json()["meta_info"][
                "input_token_logprobs"
            ]
        measured = _score(sim.url, canary, vocab_rows=VOCAB + 24)
    assert [t[1] for t in triples[1:]] == [LAST, 150, LAST, 151]
    assert measured.mismatch is None


@pytest.mark.parametrize("nested", [False, True], ids=["config", "text_config"])
def test_the_models_rows_come_from_its_config_beside_the_tokenizer(
    tokenizer_dir: str, tmp_path: Path, nested: bool
) -> None:
    """A model directory (tokenizer and ``config.json``): the config's ``vocab_size`` (a
    multimodal wrapper's ``text_config``), else the tokenizer's size."""
    from eagledata.config import TokenizerSettings
    from eagledata.source.tokenization import PromptTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(tokenizer_dir) / name, tmp_path / name)
    assert PromptTokenizer(TokenizerSettings(name=str(tmp_path))).model_vocab_rows == VOCAB
    config = {"vocab_size": VOCAB + 24}
    (tmp_path / "config.json").write_text(
        json.dumps({"text_config": config, "vocab_size": 7} if nested else config)
    )
    assert PromptTokenizer(TokenizerSettings(name=str(tmp_path))).model_vocab_rows == VOCAB + 24
