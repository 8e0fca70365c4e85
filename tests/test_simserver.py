"""The simulated SGLang server honours the contract a /generate client relies on (real HTTP)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eagledata.simserver import SimConfig, SimServerThread, expected_output
from eagledata.simserver.config import BF16_BYTES_PER_TOKEN

VOCAB, EOS = 1000, 7


def make_config(**changes: Any) -> SimConfig:
    return SimConfig(vocab_size=VOCAB, eos_token_id=EOS, **changes)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServerThread]:
    with SimServerThread(make_config()) as server:
        yield server


@pytest.fixture
def client(sim: SimServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=10) as c:
        yield c


def fresh(**changes: Any) -> SimServerThread:
    return SimServerThread(make_config(**changes))


def gen(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/generate", json=body)


def prompt(i: int, length: int = 12) -> list[int]:
    return [(i * 31 + k) % 900 + 50 for k in range(length)]


def check_item(item: dict[str, Any], ids: list[int], params: dict[str, Any]) -> None:
    meta = item["meta_info"]
    assert meta["completion_tokens"] == len(item["output_ids"])
    assert meta["prompt_tokens"] == len(ids)
    assert (item["output_ids"], meta["finish_reason"]) == expected_output(
        ids, params, make_config()
    )


# --- generation -----------------------------------------------------------------------------


def test_stop_and_length_finishes_follow_the_token_contract(client: httpx.Client) -> None:
    params = {"max_new_tokens": 24, "temperature": 0.7}
    finishes = set()
    for i in range(40):
        item = gen(client, input_ids=prompt(i), sampling_params=params).json()
        check_item(item, prompt(i), params)
        out, finish = item["output_ids"], item["meta_info"]["finish_reason"]
        finishes.add(finish["type"])
        body = out[:-1] if finish["type"] == "stop" else out
        assert all(10 <= t < VOCAB and t != EOS for t in body)
        if finish["type"] == "stop":
            assert finish == {"type": "stop", "matched": EOS}
            assert out[-1] == EOS and len(out) < 24
        else:
            assert finish == {"type": "length", "length": 24}
            assert len(out) == 24 and EOS not in out
    assert finishes == {"stop", "length"}


def test_ignore_eos_and_stop_token_ids(client: httpx.Client) -> None:
    item = gen(client, input_ids=[5, 6], sampling_params={"max_new_tokens": 9, "ignore_eos": True})
    assert item.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 9}
    assert len(item.json()["output_ids"]) == 9
    params = {"max_new_tokens": 40, "stop_token_ids": [101, 202]}
    matched = set()
    for i in range(30):
        body = gen(client, input_ids=prompt(i), sampling_params=params).json()
        out, finish = body["output_ids"], body["meta_info"]["finish_reason"]
        assert not {101, 202} & set(out[:-1])
        if finish["type"] == "stop":
            matched.add(finish["matched"])
            assert out[-1] == finish["matched"]
    assert matched == {EOS, 101, 202}


def test_a_request_refused_with_503_leaves_no_prefix_in_the_cache() -> None:
    # SGLang inserts a prompt into its radix tree after its prefill: a request the full queue
    # refused was never prefilled, so its retry costs a whole prefill again.
    with fresh(fail_503_rate=1.0) as server, httpx.Client(base_url=server.url) as http:
        body = {"input_ids": prompt(7, length=64), "sampling_params": {"max_new_tokens": 4}}
        assert gen(http, **body).status_code == 503
        server.control(fail_503_rate=0.0)
        first = gen(http, **body).json()
        assert first["meta_info"]["cached_tokens"] == 0
        assert gen(http, **body).json()["meta_info"]["cached_tokens"] == 63


def test_each_dp_rank_has_a_prefix_cache_of_its_own() -> None:
    # Each of SGLang's DP schedulers (attention ranks or replicas) keeps its own radix tree, and
    # the DP controller sends unpinned requests round robin: the same prompt twice in a row
    # lands on two ranks and misses; pinned with data_parallel_rank it hits.
    dp = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}
    with fresh(**dp) as server, httpx.Client(base_url=server.url) as http:
        body = {"input_ids": prompt(9, length=64), "sampling_params": {"max_new_tokens": 4}}
        cached = [gen(http, **body).json()["meta_info"]["cached_tokens"] for _ in range(3)]
        assert cached == [0, 0, 63]  # rank 0, rank 1, rank 0 again
        pinned = {**body, "input_ids": prompt(10, length=64), "data_parallel_rank": 1}
        cached = [gen(http, **pinned).json()["meta_info"]["cached_tokens"] for _ in range(3)]
        assert cached == [0, 63, 63]


def test_default_max_new_tokens_is_128(client: httpx.Client) -> None:
    for i in range(30):
        item = gen(client, input_ids=prompt(i)).json()
        assert len(item["output_ids"]) <= 128
        if item["meta_info"]["finish_reason"]["type"] == "length":
            assert item["meta_info"]["finish_reason"]["length"] == 128
            return
    pytest.fail("no request ran to the default length")


def test_same_request_gives_same_output(client: httpx.Client, sim: SimServerThread) -> None:
    body = {"input_ids": prompt(3), "sampling_params": {"max_new_tokens": 64, "top_p": 0.9}}
    first, second = gen(client, **body).json(), gen(client, **body).json()
    assert first["output_ids"] == second["output_ids"]
    assert second["meta_info"]["cached_tokens"] == len(prompt(3)) - 1
    with fresh() as other, httpx.Client(base_url=other.url) as c2:
        assert gen(c2, **body).json()["output_ids"] == first["output_ids"]
    changed = {**body, "sampling_params": {"max_new_tokens": 64, "top_p": 0.8}}
    assert gen(client, **changed).json()["output_ids"] != first["output_ids"]


def test_batch_and_n_return_arrays_prompt_major(client: httpx.Client) -> None:
    params = {"max_new_tokens": 16, "temperature": 1.0}
    body = gen(client, input_ids=[prompt(1), prompt(2)], sampling_params=params, rid="b").json()
    assert [x["meta_info"]["id"] for x in body] == ["b_0", "b_1"]
    check_item(body[0], prompt(1), params)
    check_item(body[1], prompt(2), params)
    samples = gen(
        client, input_ids=[prompt(1), prompt(2)], sampling_params={**params, "n": 3}, rid=["p", "q"]
    ).json()
    assert [x["meta_info"]["id"] for x in samples] == ["p_0", "p_1", "p_2", "q_0", "q_1", "q_2"]
    assert [x["meta_info"]["prompt_tokens"] for x in samples] == [12] * 6
    assert len({tuple(x["output_ids"]) for x in samples[:3]}) == 3  # samples differ
    single = gen(client, input_ids=prompt(1), sampling_params={**params, "n": 2}).json()
    assert isinstance(single, list) and len(single) == 2
    assert single[0]["output_ids"] == samples[0]["output_ids"]


def test_text_input_is_tokenized(client: httpx.Client) -> None:
    body = gen(client, text="hello", sampling_params={"max_new_tokens": 4}).json()
    assert body["meta_info"]["prompt_tokens"] == 5
    assert isinstance(body["text"], str)


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": [1, 2], "sampling_params": {"n": 0}}, "n must be"),
        (
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}},
            "min_",
        ),
        ({"input_ids": []}, "empty"),
        ({"input_ids": [1], "text": "x"}, "only one"),
        ({}, "only one"),
        ({"input_ids": [[1], []]}, "empty"),
        ({"input_ids": [1, VOCAB]}, "token id"),
    ],
)
def test_bad_values_give_400_with_message(
    client: httpx.Client, body: dict[str, Any], needle: str
) -> None:
    response = client.post("/generate", json=body)
    assert response.status_code == 400
    assert needle in response.json()["error"]["message"]


def test_unknown_sampling_key_gives_400_with_string_error(client: httpx.Client) -> None:
    response = gen(client, input_ids=[1, 2], sampling_params={"seed": 3})
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str) and "seed" in response.json()["error"]


def test_context_and_input_limits() -> None:
    with (
        fresh(context_length=100, max_total_num_tokens=60) as sim,
        httpx.Client(base_url=sim.url) as c,
    ):
        assert c.get("/server_info").json()["max_req_input_len"] == 54
        too_long = gen(c, input_ids=[20] * 100, sampling_params={"max_new_tokens": 1})
        assert "context length" in too_long.json()["error"]["message"]
        overflow = gen(c, input_ids=[20] * 50, sampling_params={"max_new_tokens": 50})
        assert overflow.status_code == 400
        assert "maximum context length of 100" in overflow.json()["error"]["message"]
        pool = gen(c, input_ids=[20] * 54, sampling_params={"max_new_tokens": 5})
        assert pool.status_code == 400
        assert "--allow-auto-truncate" in pool.json()["error"]["message"]
        assert gen(c, input_ids=[20] * 53, sampling_params={"max_new_tokens": 5}).is_success


# --- capacity, queue, abort -----------------------------------------------------------------


async def _post_many(
    url: str, bodies: list[dict[str, Any]], then: Any = None, *, in_server: int = 0
) -> list[Any]:
    """Post ``bodies`` at once; once ``in_server`` of them are in the server (its own count),
    run ``then``. The bodies' answers, then what ``then`` returned."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        tasks = [asyncio.ensure_future(c.post("/generate", json=b)) for b in bodies]
        extra = None
        if then is not None:
            async with asyncio.timeout(30):  # generous: they arrive within milliseconds
                while True:
                    stats = (await c.get("/_sim/stats")).json()
                    if stats["in_flight"] >= in_server:
                        break
                    await asyncio.sleep(0.01)
            extra = await then(c)
        return [*(await asyncio.gather(*tasks)), extra]


@pytest.mark.slow
def test_kv_pool_queues_and_queue_full_gives_503() -> None:
    config = dict(latency_s=1.0, max_total_num_tokens=200, max_queued_requests=1)
    body = {"input_ids": [30] * 100, "sampling_params": {"max_new_tokens": 50}}
    with fresh(**config) as sim:

        async def load(c: httpx.AsyncClient) -> Any:
            return (await c.get("/get_load")).json()

        start = time.monotonic()
        # one runs, one waits, the third finds the queue full (while the first still runs)
        *responses, snapshot = asyncio.run(_post_many(sim.url, [body] * 3, load, in_server=2))
        codes = sorted(r.status_code for r in responses)
        assert codes == [200, 200, 503]
        full = next(r for r in responses if r.status_code == 503).json()
        assert full == {
            "object": "error",
            "message": "The request queue is full.",
            "type": "503",
            "param": None,
            "code": 503,
        }
        assert snapshot[0]["num_waiting_reqs"] == 1 and snapshot[0]["num_reqs"] == 2
        assert time.monotonic() - start >= 2.0  # the second one waited for the first
        assert sim.stats()["outcomes"]["queue_full"] == 1


@pytest.mark.slow
def test_abort_request_aborts_every_rid_with_that_prefix() -> None:
    with fresh(latency_s=3.0) as sim:  # long enough to be aborted half-way on a busy machine
        params = {"max_new_tokens": 50, "ignore_eos": True}
        bodies = [
            {"input_ids": prompt(i), "sampling_params": params, "rid": rid}
            for i, rid in enumerate(["job1", "job12", "job2"])
        ]

        async def abort(c: httpx.AsyncClient) -> Any:
            # The simulator's output grows with the time since admission: 0.3 s is at least a
            # few tokens (a busy machine only makes it more), and 2.7 s short of the end.
            await asyncio.sleep(0.3)
            missing = await c.post("/abort_request", json={"rid": "job"})  # not in flight
            hit = await c.post("/abort_request", json={"rid": "job1"})
            return missing.status_code, hit.status_code, hit.content

        *responses, outcome = asyncio.run(_post_many(sim.url, bodies, abort, in_server=3))
        assert outcome == (200, 200, b"")
        job1, job12, job2 = (r.json() for r in responses)
        for aborted in (job1, job12):
            assert [r.status_code for r in responses] == [200, 200, 200]
            assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
            assert 0 < len(aborted["output_ids"]) < 50
            assert aborted["meta_info"]["completion_tokens"] == len(aborted["output_ids"])
        assert job2["meta_info"]["finish_reason"] == {"type": "length", "length": 50}


@pytest.mark.slow
def test_flush_cache_refused_while_running() -> None:
    with fresh(latency_s=3.0) as sim:

        async def flush(c: httpx.AsyncClient) -> int:
            return (await c.post("/flush_cache")).status_code

        body = {"input_ids": [20, 21]}
        *_, during = asyncio.run(_post_many(sim.url, [body], flush, in_server=1))
        assert during == 400
        assert httpx.get(sim.url + "/flush_cache").status_code == 200


# --- streaming ------------------------------------------------------------------------------


def events(text: str) -> list[Any]:
    assert text.endswith("data: [DONE]\n\n")
    chunks = [c for c in text.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks)
    return [orjson.loads(c[6:]) for c in chunks[:-1]]


def test_streaming_is_cumulative_and_ends_with_done(client: httpx.Client) -> None:
    params = {"max_new_tokens": 20, "ignore_eos": True}
    response = gen(client, input_ids=prompt(8), sampling_params=params, stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.text)
    assert len(chunks) == 20
    for n, chunk in enumerate(chunks, start=1):
        assert chunk["output_ids"] == chunks[-1]["output_ids"][:n]
        assert chunk["meta_info"]["completion_tokens"] == n
        assert (chunk["meta_info"]["finish_reason"] is None) == (n < 20)
    check_item(chunks[-1], prompt(8), params)


def test_streaming_errors_arrive_as_events(client: httpx.Client) -> None:
    response = gen(client, input_ids=[], stream=True)
    assert response.status_code == 200
    assert "empty" in events(response.text)[0]["error"]["message"]


# --- server info and KV dtype ---------------------------------------------------------------


def bytes_per_token(info: dict[str, Any]) -> float:
    usage = info["internal_states"][0]["memory_usage"]
    return float(usage["kvcache"] * 2**30 / usage["token_capacity"])


def test_server_info_reports_args_internal_states_and_kv_size(client: httpx.Client) -> None:
    info = client.get("/get_server_info").json()
    expected = {
        "model_path",
        "tp_size",
        "dp_size",
        "enable_dp_attention",
        "kv_cache_dtype",
        "dtype",
        "mem_fraction_static",
        "max_total_num_tokens",
        "max_req_input_len",
        "max_running_requests",
        "max_queued_requests",
        "enable_hierarchical_cache",
        "chunked_prefill_size",
        "context_length",
        "status",
        "version",
    }
    assert expected <= set(info)
    assert info["status"] == "ready" and info["max_total_num_tokens"] == 116_000
    assert info["max_req_input_len"] == 116_000 - 1 - 5
    state = info["internal_states"][0]
    assert state["kv_cache_dtype"] == "bf16"
    assert state["effective_max_running_requests_per_dp"] == 2048
    assert bytes_per_token(info) == pytest.approx(BF16_BYTES_PER_TOKEN)
    assert client.get("/server_info").json()["kv_cache_dtype"] == "bf16"


def test_auto_kv_dtype_can_resolve_to_fp8() -> None:
    with fresh(kv_cache_dtype="auto", internal_kv_cache_dtype="fp8_e4m3", dp_size=2) as sim:
        info = httpx.get(sim.url + "/server_info").json()
    assert info["kv_cache_dtype"] == "auto"
    assert [s["kv_cache_dtype"] for s in info["internal_states"]] == ["fp8_e4m3"] * 2
    assert bytes_per_token(info) == pytest.approx(35_136)
    with fresh(kv_cache_dtype="auto") as sim:
        info = httpx.get(sim.url + "/server_info").json()
    assert info["internal_states"][0]["kv_cache_dtype"] == "bf16"


def test_fp8_switch_changes_outputs_detectably() -> None:
    body = {"input_ids": prompt(4), "sampling_params": {"max_new_tokens": 32}, "rid": "a"}
    with fresh() as sim, httpx.Client(base_url=sim.url) as c:
        bf16 = gen(c, **body).json()["output_ids"]
        sim.control(kv_cache_dtype="fp8_e4m3")
        fp8 = gen(c, **{**body, "rid": "b"}).json()["output_ids"]
        stats = sim.stats()
    assert fp8 != bf16
    fp8_config = make_config(kv_cache_dtype="fp8_e4m3")
    assert fp8 == expected_output(prompt(4), body["sampling_params"], fp8_config)[0]
    assert stats["rid_kv_dtype"] == {"a": "bf16", "b": "fp8_e4m3"}
    assert stats["by_kv_dtype"] == {"bf16": 1, "fp8_e4m3": 1}


def test_model_info_models_load_and_metrics(client: httpx.Client) -> None:
    info = client.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_type"] == "kimi_k25"
    assert client.get("/model_info").json() == info
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "moonshotai/Kimi-K2.5"
    assert models["data"][0]["max_model_len"] == 262_144
    assert client.get("/get_load").json()[0]["dp_rank"] == 0
    text = client.get("/metrics").text
    for name in (
        "num_running_reqs",
        "num_queue_reqs",
        "token_usage",
        "gen_throughput",
        "cache_hit_rate",
        "max_total_num_tokens",
    ):
        assert f'sglang:{name}{{model_name="moonshotai/Kimi-K2.5"' in text


# --- health and control ---------------------------------------------------------------------


def test_health_is_503_during_startup_and_when_unhealthy() -> None:
    # A start-up that lasts as long as the test needs; shortening it ends it (the window runs
    # from the server's start): no sleep has to outlast it.
    with fresh(startup_s=3600) as sim, httpx.Client(base_url=sim.url) as c:
        early = c.get("/health")
        assert early.status_code == 503 and early.content == b""
        sim.control(startup_s=0.01)
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").content == b""
        assert c.post("/_sim/control", json={"healthy": False}).json()["healthy"] is False
        assert c.get("/health_generate").status_code == 503
        assert c.post("/_sim/control", json={"nope": 1}).status_code == 400
        assert c.get("/_sim/stats").json()["requests"] == 0


# --- faults ---------------------------------------------------------------------------------


def test_each_fault_happens_at_rate_one() -> None:
    body = {"input_ids": prompt(5), "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    with fresh(stall_s=0.3) as sim, httpx.Client(base_url=sim.url, timeout=5) as c:
        sim.control(fail_500_rate=1.0)
        assert gen(c, **body).status_code == 500
        sim.control(fail_500_rate=0.0, fail_503_rate=1.0)
        assert gen(c, **body).json()["code"] == 503
        sim.control(fail_503_rate=0.0, reset_rate=1.0)
        with pytest.raises(httpx.TransportError):
            gen(c, **body)
        sim.control(reset_rate=0.0, abort_rate=1.0)
        aborted = gen(c, **body)
        assert aborted.status_code == 200
        assert aborted.json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(aborted.json()["output_ids"]) == 6
        sim.control(abort_rate=0.0, bad_count_rate=1.0)
        meta = gen(c, **body).json()["meta_info"]
        assert meta["completion_tokens"] == 13
        sim.control(bad_count_rate=0.0, stream_error_rate=1.0)
        chunks = events(gen(c, **body, stream=True).text)
        assert chunks[-1] == {"error": {"message": "Simulated mid-stream error."}}
        sim.control(stream_error_rate=0.0, stall_rate=1.0)
        start = time.monotonic()
        assert gen(c, **body).is_success
        assert time.monotonic() - start >= 0.3
        outcomes = sim.stats()["outcomes"]
    for kind in ("fail_500", "fail_503", "reset", "fault_abort", "bad_count", "stream_error"):
        assert outcomes[kind] == 1, kind
    assert outcomes["stall"] == 1


def test_a_server_can_degrade_by_itself_after_a_number_of_generations() -> None:
    """``degrade_after_generations``: the first N requests for new tokens are answered healthy,
    every request after them degraded (still bf16 everywhere); prefill-only requests (the
    canary's warm-ups and scorings) do not count towards N."""
    with fresh(degrade_after_generations=2) as sim, httpx.Client(base_url=sim.url) as c:
        rids = []
        for index, max_new in enumerate([5, 0, 5, 5, 0]):
            rid = f"r{index}"
            body = {"input_ids": prompt(index), "sampling_params": {"max_new_tokens": max_new}}
            assert gen(c, **body, rid=rid).is_success
            rids.append(rid)
        degraded = set(sim.stats()["answers"]["degraded"])
        assert c.get("/server_info").json()["kv_cache_dtype"] == "bf16"
    assert degraded == {"r3", "r4"}


def test_fault_draws_are_reproducible() -> None:
    def codes() -> list[int]:
        with fresh(fail_500_rate=0.5, seed=7) as sim, httpx.Client(base_url=sim.url) as c:
            return [gen(c, input_ids=prompt(i % 4)).status_code for i in range(16)]

    first = codes()
    assert first == codes() and {200, 500} == set(first)


# --- tokenizer and process entry point --------------------------------------------------------


def test_tokenizer_path_gives_vocab_eos_and_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"], show_progress=False
    )
    tokenizer.train_from_iterator(["hello world, the quick brown fox"] * 50, trainer)
    tokenizer.add_special_tokens(["<|tool|>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|im_end|>")
    special = {tokenizer.token_to_id(t) for t in ("<unk>", "<|im_start|>", "<|tool|>")}
    with SimServerThread(SimConfig(tokenizer_path=str(tmp_path))) as sim:
        c = httpx.Client(base_url=sim.url)
        items = gen(c, text=["hello", "fox"], sampling_params={"max_new_tokens": 30, "n": 4})
        for item in items.json():
            out = item["output_ids"]
            stopped = item["meta_info"]["finish_reason"]["type"] == "stop"
            body = out[:-1] if stopped else out
            assert all(10 <= t < tokenizer.get_vocab_size() for t in body)
            assert not (special | {eos}) & set(body)
            assert out[-1] == eos if stopped else len(out) == 30
            assert item["text"] == tokenizer.decode(body)


def test_run_sim_server_prints_its_port() -> None:
    code = (
        "from eagledata.simserver import SimConfig, run_sim_server; "
        "run_sim_server(SimConfig(), '127.0.0.1', 0)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("sim-server listening on http://127.0.0.1:")
        url = line.split()[-1]
        assert httpx.get(url + "/health").status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
