"""The ``/generate`` wire types read what the real SGLang 0.5.23 answered (the recorded answers in
``tests/fixtures/sglang-0.5.23-cpu/``) and what older releases answer, and a malformed answer is
the contract error it always was, whichever field breaks it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from eagledata.errors import ContractViolationError, RetryableItemError
from eagledata.server.answers import generate_answer
from eagledata.server.bodies import Reply
from eagledata.server.generate_types import (
    FinishAbort,
    FinishLength,
    GenerateAnswer,
    GenerateRequest,
    SamplingParams,
)
from eagledata.server.responses import check_answer, response_bound
from eagledata.server.serverfacts import BOTH_PIN_FIELDS

FIXTURES = Path(__file__).parent / "fixtures" / "sglang-0.5.23-cpu"
GENERATE = ("generate_plain", "generate_logprobs", "generate_logprobs_start0", "generate_abort")


def recorded(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return loaded


def answer_of(item: Any, request: GenerateRequest, status: int = 200) -> Any:
    reply = Reply("POST", "/generate", status, "application/json", orjson.dumps(item))
    return generate_answer(reply, request, "http://s", "SGLANG_API_KEY", vocab_size=200_000)


@pytest.mark.parametrize("name", GENERATE)
def test_the_recorded_requests_are_sent_as_recorded(name: str) -> None:
    sent = recorded(name)["request"]
    request = GenerateRequest.model_validate(sent)
    assert orjson.loads(request.body()) == sent  # nothing added, no null for an unset field


@pytest.mark.parametrize(
    "name", ["generate_plain", "generate_logprobs", "generate_logprobs_start0"]
)
def test_the_real_answers_parse_and_keep_the_contract(name: str) -> None:
    fixture = recorded(name)
    request = GenerateRequest.model_validate({**fixture["request"], "rid": "r"})
    answer = GenerateAnswer.model_validate_json(orjson.dumps(fixture["response"]))
    assert isinstance(answer.meta_info.finish_reason, FinishLength)
    assert answer.meta_info.num_retractions == 0
    result = answer_of(fixture["response"], request)
    assert result.output_ids == fixture["response"]["output_ids"]
    assert (result.finish_reason, result.prompt_tokens) == ("length", 8)
    assert (result.cached_tokens, result.weight_version) == (
        fixture["response"]["meta_info"]["cached_tokens"],
        "default",
    )
    if "top_logprobs_num" in fixture["request"]:
        top = answer.meta_info.output_top_logprobs
        assert top is not None and len(top) == 6
        assert all(entry is not None and len(entry) == 3 for entry in top)
    if name == "generate_logprobs_start0":  # the first input position has no logprob
        first = answer.meta_info.input_token_logprobs
        assert first is not None and first[0][0] is None and first[0][1] == 1


def test_the_real_abort_answer_is_a_failure_to_retry() -> None:
    fixture = recorded("generate_abort")
    answer = GenerateAnswer.model_validate(fixture["response"])
    assert isinstance(answer.meta_info.finish_reason, FinishAbort)
    with pytest.raises(RetryableItemError, match="server aborted the request: Aborted") as caught:
        answer_of(fixture["response"], GenerateRequest.model_validate(fixture["request"]))
    assert caught.value.reason == "server_abort"


def plain(**meta: Any) -> dict[str, Any]:
    base = {"prompt_tokens": 3, "completion_tokens": 2, "finish_reason": {"type": "length"}}
    return {"text": "ab", "output_ids": [5, 7], "meta_info": {**base, **meta}}


REQUEST = GenerateRequest(
    input_ids=[1, 2, 3], sampling_params=SamplingParams(max_new_tokens=2), rid="r"
)


def test_provenance_of_the_wrong_type_reads_as_none_and_counts_of_older_releases_are_read() -> None:
    result = answer_of(
        plain(
            weight_version=7,
            cached_tokens=True,
            e2e_latency=3,
            total_retractions=2,  # 0.5.9's name
            spec_verify_ct=-1,
        ),
        REQUEST,
    )
    assert (result.weight_version, result.cached_tokens, result.spec_verify_ct) == (
        None,
        None,
        None,
    )
    assert result.e2e_latency == 3.0 and type(result.e2e_latency) is float
    assert result.retractions == 2


def test_an_answer_cut_at_its_length_on_its_stop_token_reads_as_stopped() -> None:
    """0.5.9 and 0.5.15.post1 say ``length`` where 0.5.23 says ``stop`` for the same ids."""
    params = SamplingParams(max_new_tokens=2, stop_token_ids=[7])
    request = REQUEST.model_copy(update={"sampling_params": params})
    answer = GenerateAnswer.model_validate(plain())
    result = check_answer(answer, [1, 2, 3], "r", "http://s", stop_ids=frozenset({7}))
    assert (result.finish_reason, result.matched) == ("stop", 7)
    stopped = answer_of(plain(finish_reason={"type": "stop", "matched": True}), request)
    assert (stopped.finish_reason, stopped.matched) == ("stop", None)  # a boolean is no token


MALFORMED: dict[str, tuple[Any, str]] = {
    "a list": ([plain()], "response is list, not an object"),
    "no meta_info": ({"output_ids": [5, 7]}, "response lacks meta_info or output_ids"),
    "a float count": (plain(prompt_tokens=3.0), "meta_info.prompt_tokens is 3.0, not an integer"),
    "a string id": (
        {**plain(), "output_ids": [5, "7"]},
        "output_ids[1] is '7', not an integer token id",
    ),
    "a boolean id": (
        {**plain(), "output_ids": [True, 7]},
        "output_ids[0] is True, not an integer token id",
    ),
    "an unknown finish": (plain(finish_reason={"type": "eos"}), "unknown finish_reason"),
    "a bad logprob": (
        plain(output_token_logprobs=[["x", 5, None]]),
        "meta_info.output_token_logprobs.0.0",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_answer_is_the_contract_error_naming_what_is_wrong(case: str) -> None:
    item, message = MALFORMED[case]
    with pytest.raises(ContractViolationError, match=message.replace("[", r"\[")) as caught:
        answer_of(item, REQUEST)
    assert caught.value.reason == "contract_violation"


def test_an_abort_wins_over_a_malformed_field() -> None:
    """An aborted request is retried: a broken count beside the abort does not make it a
    contract violation that would not be."""
    item = plain(finish_reason={"type": "abort", "message": "gone"}, prompt_tokens="3")
    with pytest.raises(RetryableItemError, match="gone"):
        answer_of(item, REQUEST)


def test_a_request_is_typed_where_the_contract_lives_and_pinned_as_the_release_knows() -> None:
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate({"input_ids": [1], "sampling_params": {"ignore_eos": 1}})
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate({"input_ids": [1], "sampling_params": {}, "text": "hi"})
    request = GenerateRequest.model_validate(
        {"input_ids": [1], "sampling_params": {"max_new_tokens": 4, "repetition_penalty": 1.1}}
    )
    pinned = request.pinned(BOTH_PIN_FIELDS, 1)
    body = orjson.loads(pinned.body())
    assert body["sampling_params"] == {"max_new_tokens": 4, "repetition_penalty": 1.1}
    assert {key: body[key] for key in BOTH_PIN_FIELDS} == dict.fromkeys(BOTH_PIN_FIELDS, 1)
    assert pinned.rank == 1 and request.rank is None
    assert response_bound(pinned) == response_bound(request)
