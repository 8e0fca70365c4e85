"""The simulator answers in the real SGLang 0.5.23's shapes, as recorded from a real server.

``tests/fixtures/sglang-0.5.23-cpu/`` holds what a real 0.5.23 server on this CPU answered
(``scripts/record_sglang_shapes.py`` re-records it): ``/generate`` plain, with logprobs and
top logprobs, from ``logprob_start_len`` 0, and cut by ``/abort_request``; ``/server_info``,
``/get_model_info``, ``/v1/loads`` and ``/metrics``. Each request is replayed on the simulator
configured like that server, and the two answers are compared key by key: a key the real server
has and the simulator lacks, a key only the simulator has, or a value of another JSON type, is a
difference. :data:`ACCEPTED` lists the differences kept on purpose, each with why; any other one
fails, and so does an accepted one that no longer occurs (the list stays true).

No server is started: the fixtures are the real side. Logprob numbers are not compared (the
fixtures keep their types only).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eagledata.server.loads import METRIC_NAMES
from eagledata.server.serverfacts import InternalState, MemoryUsage, ServerFacts
from eagledata.simserver import SimConfig, SimServerThread
from realserver import load_script

FIXTURES = Path(__file__).parent / "fixtures" / "sglang-0.5.23-cpu"
# in the order they were recorded: the prefix cache sees the same history
NAMES = (
    "generate_plain",
    "generate_logprobs",
    "generate_logprobs_start0",
    "generate_abort",
    "server_info",
    "get_model_info",
    "v1_loads",
    "metrics",
)


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return loaded


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def differences(real: Any, sim: Any, path: str = "$") -> Iterator[str]:
    """Where ``sim`` is not shaped like ``real``: ``missing PATH``, ``extra PATH`` or
    ``type PATH real->sim``. A list's items are compared pairwise up to the shorter one."""
    real_type, sim_type = json_type(real), json_type(sim)
    if real_type != sim_type:
        yield f"type {path} {real_type}->{sim_type}"
        return
    if real_type == "object":
        for key in sorted(real.keys() - sim.keys()):
            yield f"missing {path}.{key}"
        for key in sorted(sim.keys() - real.keys()):
            yield f"extra {path}.{key}"
        for key in sorted(real.keys() & sim.keys()):
            yield from differences(real[key], sim[key], f"{path}.{key}")
    elif real_type == "list":
        for index, (real_item, sim_item) in enumerate(zip(real, sim, strict=False)):
            yield from differences(real_item, sim_item, f"{path}[{'*' if index else 0}]")


def unique(items: Iterator[str]) -> list[str]:
    return list(dict.fromkeys(items))


ACCEPTED: dict[tuple[str, str], str] = {
    ("server_info", "type $.attention_backend string->null"): (
        "SGLang writes back the attention backend it resolved (torch_native on this CPU); the "
        "simulator stands for no particular GPU and names none. No client reads it."
    ),
    ("server_info", "type $.internal_states[0].attention_backend string->null"): (
        "as the top-level attention_backend"
    ),
    ("server_info", "type $.context_length null->number"): (
        "the real server reports --context-length as launched: null without the flag (the "
        "recorded one), the model's limit then comes from its config. The simulator always "
        "reports its context length; ServerFacts reads both (Optional)."
    ),
    ("server_info", "type $.internal_states[0].context_length null->number"): (
        "as the top-level context_length"
    ),
    ("server_info", "type $.max_total_tokens number->null"): (
        "--max-total-tokens as launched (the recorded server was capped at 4096); the "
        "simulator's pool is max_total_num_tokens with the flag unset. The client reads "
        "max_total_num_tokens, which both report."
    ),
    ("server_info", "type $.internal_states[0].max_total_tokens number->null"): (
        "as the top-level max_total_tokens"
    ),
    ("get_model_info", "missing $.embedding"): (
        "an embedding model's settings (disabled for a generation model): a 25-key object no "
        "client reads and no generation run depends on"
    ),
    ("v1_loads", "type $.loads[0].decode_moments list->null"): (
        "decode step-time moment sums: the simulator does not model them and sends null, as a "
        "real server does before its first decode. No client reads them."
    ),
    ("metrics", "extra sglang:num_retracted_requests_total"): (
        "SGLang creates the retraction counters at the first retraction; the recorded server "
        "had none, the simulator shows them at 0 from the start. The client reads the counter "
        "when present and the gauge num_retracted_reqs otherwise (server/loads.py)."
    ),
    ("metrics", "extra sglang:num_retracted_input_tokens_total"): "as num_retracted_requests_total",
    (
        "metrics",
        "extra sglang:num_retracted_output_tokens_total",
    ): "as num_retracted_requests_total",
}
"""Differences kept on purpose: (fixture, difference) -> why."""

# What the client parses out of /server_info (server/serverfacts.py): a key it reads must be there
# in the simulator's answer whenever the real server sends it. Other keys the real server sends
# (0.5.23 reports all ~550 ServerArgs, twice) are server settings no client reads; the simulator
# sends the ones its features need, so their absence is not a difference. A key only the
# simulator has, or a value of another type, always is.
CLIENT_KEYS = {
    "$": set(ServerFacts.model_fields),
    "$.internal_states[0]": set(InternalState.model_fields),
    "$.internal_states[0].memory_usage": set(MemoryUsage.model_fields),
}


def read_by_client(difference: str) -> bool:
    path = difference.split()[1]
    parent, _, key = path.rpartition(".")
    return key in CLIENT_KEYS.get(parent, set()) or parent.startswith(
        "$.internal_states[0].memory_usage"
    )


def metric_differences(real: list[str], sim: list[str]) -> Iterator[str]:
    """``/metrics`` as sets of ``name{labels}``: a sample the client reads (server/loads.py)
    must carry the same labels in both; any sample only the simulator sends is a difference."""
    real_set, sim_set = set(real), set(sim)
    for sample in sorted(real_set - sim_set):
        if sample.split("{")[0] in METRIC_NAMES:
            yield f"missing {sample.split('{')[0]}"
    for sample in sorted(sim_set - real_set):
        yield f"extra {sample.split('{')[0]}"


def found_differences(name: str, sim: Any) -> list[str]:
    real = fixture(name)["response"]
    if name == "metrics":
        return unique(metric_differences(real, sim))
    found = unique(differences(real, sim))
    if name == "server_info":
        found = [d for d in found if not d.startswith("missing ") or read_by_client(d)]
    return found


@pytest.fixture(scope="module")
def sim_url(tokenizer_dir: str) -> Iterator[str]:
    """The simulator configured like the recorded server: 0.5.23, one CPU rank, a 4,096-token
    bf16 pool, the bundled tokenizer's vocabulary, metrics on."""
    config = SimConfig(
        tokenizer_path=tokenizer_dir,
        model_path="<model>",
        version="0.5.23",
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        context_length=4096,
        max_total_num_tokens=4096,
        tp_size=1,
        kv_cache_dtype="bf16",
        dtype="bfloat16",
        decode_tok_per_s=40.0,
    )
    with SimServerThread(config) as server:
        yield server.url


def replay(url: str, name: str) -> Any:
    """The simulator's answer to the recorded request ``name``."""
    recorded = fixture(name)
    with httpx.Client(base_url=url, timeout=60) as client:
        request = recorded["request"]
        if name == "generate_abort":
            return _replay_abort(client, recorded)
        if request.get("method") == "GET":
            answer = client.get(request["path"])
            assert answer.status_code == recorded["status"], answer.text
            if name == "metrics":
                return load_script("record_sglang_shapes").metric_names(answer.text)
            return answer.json()
        answer = client.post("/generate", json=request)
        assert answer.status_code == recorded["status"], answer.text
        return answer.json()


def _replay_abort(client: httpx.Client, recorded: dict[str, Any]) -> Any:
    import threading
    import time

    answer: dict[str, Any] = {}

    def send() -> None:
        answer["response"] = client.post("/generate", json=recorded["request"])

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.5)
    aborted = client.post("/abort_request", json=recorded["abort_request"])
    sender.join(timeout=60)
    assert aborted.status_code == recorded["abort_status"]
    assert answer["response"].status_code == recorded["status"]
    return answer["response"].json()


def test_the_simulator_answers_in_the_real_shapes(sim_url: str) -> None:
    unexpected, stale = [], []
    for name in NAMES:
        found = found_differences(name, replay(sim_url, name))
        unexpected += [f"{name}: {d}" for d in found if (name, d) not in ACCEPTED]
        stale += [f"{n}: {d}" for (n, d) in ACCEPTED if n == name and d not in found]
    assert not unexpected, (
        "the simulator's answers drifted from the real SGLang 0.5.23's "
        "(tests/fixtures/sglang-0.5.23-cpu): fix the simulator, or accept the difference in "
        "ACCEPTED with why:\n" + "\n".join(unexpected)
    )
    assert not stale, "accepted differences that no longer occur (drop them):\n" + "\n".join(stale)


def test_the_client_reads_the_real_server_info() -> None:
    """The recorded /server_info parses, and says what the KV guard needs: a bf16 pool."""
    facts = ServerFacts.from_server_info(fixture("server_info")["response"])
    assert facts.version == "0.5.23" and facts.release_known
    assert facts.kv_cache_dtype == "bf16"
    assert facts.internal_states and facts.internal_states[0].kv_cache_dtype == "bf16"
    assert facts.max_total_num_tokens == 4096
    assert facts.dp_ranks == 1


def test_every_fixture_is_compared() -> None:
    assert sorted(NAMES) == sorted(path.stem for path in FIXTURES.glob("*.json"))


def test_differences_reads_each_kind() -> None:
    real = {"a": 1, "b": {"c": [1, 2]}, "d": None, "e": [{"f": 1}, {"f": 2}]}
    sim = {"a": 1.5, "b": {"c": "x"}, "g": 0, "e": [{"f": 1}, {}]}
    assert list(differences(real, sim)) == [
        "missing $.d",
        "extra $.g",
        "type $.b.c list->string",
        "missing $.e[*].f",
    ]
