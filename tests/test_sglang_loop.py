"""The second SGLang scheduler model (``engine="sglang-loop"``, simserver/sglang_loop.py): the
rules it takes from SGLang's source, seen through the HTTP API as a client sees them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from conftest import sim_config
from eagledata.simserver import SimServerThread, expected_output


def loop_engine(tokenizer_dir: str, **overrides: Any) -> Any:
    fields: dict[str, Any] = {
        "engine": "sglang-loop",
        "max_total_num_tokens": 1200,
        "time_scale": 0.02,
        "length_fraction": 0.0,
        "output_len_mean": 300.0,
        "output_len_spread": 0.0,
        "clip_max_new_tokens_estimation": 64,
    }
    fields.update(overrides)
    return sim_config(tokenizer_dir, **fields)


async def send_staggered(url: str, count: int, gap_s: float) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as http:

        async def one(index: int) -> httpx.Response:
            await asyncio.sleep(gap_s * index)
            body = {
                "input_ids": list(range(20 + index, 120 + index)),
                "sampling_params": {"max_new_tokens": 512},
                "rid": f"r{index}",
            }
            return await http.post(url + "/generate", json=body)

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def test_it_over_admits_then_retracts_the_youngest_who_keep_their_output(
    tokenizer_dir: str,
) -> None:
    """``retract_decode``: the fewest output tokens go first; a retracted request keeps its
    output and is prefilled again, so its answer is the one it would have had."""
    config = loop_engine(tokenizer_dir)
    with SimServerThread(config) as sim:
        answers = [r.json() for r in asyncio.run(send_staggered(sim.url, 6, 0.05))]
        engine = sim.stats()["engine"][0]
    counts = [answer["meta_info"]["total_retractions"] for answer in answers]
    assert engine["retracted_total"] > 0 and sum(counts) == engine["retracted_total"]
    assert counts[0] == 0  # the oldest, with the most output, is never the one to go
    assert engine["retracted_output_tokens"] > 0  # output thrown away and prefilled again
    for index, answer in enumerate(answers):
        ids = list(range(20 + index, 120 + index))
        expected, _ = expected_output(ids, {"max_new_tokens": 512}, config)
        assert answer["output_ids"] == expected


def test_a_retracted_request_on_a_full_queue_is_refused_with_503(tokenizer_dir: str) -> None:
    """SGLang puts a retracted request back through ``_add_request_to_queue``, whose queue cap
    aborts it with 503 when the waiting queue is full: the client sees a 503 for a request that
    was running."""
    config = loop_engine(tokenizer_dir, max_queued_requests=1)
    with SimServerThread(config) as sim:
        responses = asyncio.run(send_staggered(sim.url, 8, 0.03))
        stats = sim.stats()
    refused = [r for r in responses if r.status_code == 503]
    assert stats["outcomes"]["queue_full_retracted"] > 0
    assert len(refused) == stats["outcomes"]["queue_full_retracted"] + stats["outcomes"].get(
        "queue_full", 0
    )
    assert all(r.json()["message"] == "The request queue is full." for r in refused)
    assert stats["engine"][0]["retracted_rejected"] == stats["outcomes"]["queue_full_retracted"]


def test_no_prefill_is_tried_while_the_batch_is_full_until_a_request_ends(
    tokenizer_dir: str,
) -> None:
    """``batch_is_full``: once admission stops for lack of tokens, the decaying ratio does not
    let the waiting request in; only a running request that ends (filtered out of the batch)
    does. Two requests of equal length: the one admitted second waits for the whole of the other."""
    config = loop_engine(
        tokenizer_dir,
        max_total_num_tokens=1000,
        output_len_mean=200.0,
        clip_max_new_tokens_estimation=4096,
        new_token_ratio_decay_steps=10,  # the ratio reaches its floor long before the end
    )

    async def run(url: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as http:

            async def one(index: int) -> dict[str, Any]:
                body = {
                    "input_ids": list(range(20 + index, 220 + index)),
                    "sampling_params": {"max_new_tokens": 400},
                }
                return dict((await http.post(url + "/generate", json=body)).json())

            return list(await asyncio.gather(one(0), one(1)))

    with SimServerThread(config) as sim:
        first, second = asyncio.run(run(sim.url))
        engine = sim.stats()["engine"][0]
    # Sent together: the first takes 200 + 400; the second needs 600 more, which the first's
    # reserve (400 x 0.7) leaves no room for. Ten steps later that reserve is at its floor
    # (~0.1 x 400) and it would fit, but the batch is full until the first ends.
    # Which of the two reaches the server first is the client's race, not the scheduler's rule.
    admitted, waited = sorted(a["meta_info"]["e2e_latency"] for a in (first, second))
    assert engine["retracted_total"] == 0
    assert waited > 1.5 * admitted
    assert engine["prefill_batches"] == 2


def test_a_full_waiting_queue_refuses_a_new_request_with_503(tokenizer_dir: str) -> None:
    config = loop_engine(tokenizer_dir, max_running_requests=1, max_queued_requests=2)
    with SimServerThread(config) as sim:
        responses = asyncio.run(send_staggered(sim.url, 6, 0.0))
        stats = sim.stats()
    codes = sorted(r.status_code for r in responses)
    assert codes.count(503) == stats["outcomes"]["queue_full"] >= 1
    assert stats["max_in_flight"] <= 3  # one running, two waiting


def test_a_prompt_that_holds_the_long_token_gets_the_long_answers_whenever_it_arrives(
    tokenizer_dir: str,
) -> None:
    """``output_len_long_token``: the answer length belongs to the prompt (the benchmark's
    ``growing`` job), not to the time its request arrives: a marked prompt sent first gets the
    long answer, an unmarked one sent after it the short one."""
    config = loop_engine(
        tokenizer_dir, max_total_num_tokens=4000, output_len_long_token=7,
        output_len_long_mean=500.0,
    )  # fmt: skip
    marked, plain = [*range(20, 120), 7], list(range(20, 121))

    async def run(url: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as http:
            answers = []
            for ids in (marked, plain):
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 800}}
                answers.append(dict((await http.post(url + "/generate", json=body)).json()))
            return answers

    with SimServerThread(config) as sim:
        long, short = asyncio.run(run(sim.url))
    # ~500 and ~300 (the body is cut at a whole word, a few tokens short of the mean)
    assert 450 <= long["meta_info"]["completion_tokens"] <= 500
    assert 270 <= short["meta_info"]["completion_tokens"] <= 300
    for answer, ids in ((long, marked), (short, plain)):
        assert answer["output_ids"] == expected_output(ids, {"max_new_tokens": 800}, config)[0]
