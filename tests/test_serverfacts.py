"""The bf16-KV guard on /server_info bodies shaped like SGLang 0.5.9 (S9) and 0.5.23 (S23)."""

from __future__ import annotations

from typing import Any

import pytest

from eagledata.errors import ServerRefusedError
from eagledata.server.facts_report import format_facts
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import evaluate_kv_guard

KIMI = "moonshotai/Kimi-K2.5"
BF16_BPT = 70_272


def s9_body(
    *,
    requested: str = "bf16",
    internal: tuple[str | None, ...] = ("bf16",),
    model: str = KIMI,
    tokens: int = 116_000,
    bytes_per_token: int = BF16_BPT,
    dp_attention: bool = False,
    with_internal_states: bool = True,
) -> dict[str, Any]:
    """A flat S9 body: ServerArgs fields, rank-0 scheduler info, internal_states, version."""
    kvcache = round(tokens * bytes_per_token / 2**30, 2)
    states = []
    for dtype in internal:
        state: dict[str, Any] = {
            "model_path": model,
            "tp_size": 8,
            "memory_usage": {
                "weight": 72.5,
                "kvcache": kvcache,
                "token_capacity": tokens,
                "graph": 1.3,
            },
            "effective_max_running_requests_per_dp": 2048,
            "last_gen_throughput": 512.3,
        }
        if dtype is not None:
            state["kv_cache_dtype"] = dtype
        states.append(state)
    body: dict[str, Any] = {
        "model_path": model,
        "tokenizer_path": model,
        "served_model_name": model,
        "dtype": "auto",
        "kv_cache_dtype": requested,
        "quantization": None,
        "tp_size": 8,
        "dp_size": len(internal) if dp_attention else 1,
        "enable_dp_attention": dp_attention,
        "mem_fraction_static": 0.85,
        "max_total_tokens": None,
        "max_running_requests": None,
        "chunked_prefill_size": 8192,
        "cuda_graph_max_bs": 512,
        "context_length": None,
        "page_size": 1,
        "enable_hierarchical_cache": False,
        "host": "127.0.0.1",
        "port": 30000,
        "status": "ready",
        "max_total_num_tokens": tokens,
        "max_req_input_len": 262_139,
        "version": "0.5.9",
    }
    if with_internal_states:
        body["internal_states"] = states
    return body


def judge(body: dict[str, Any], **kwargs: Any) -> Any:
    facts = ServerFacts.from_server_info(body)
    options: dict[str, Any] = {"expected_model": KIMI, "bf16_bytes_per_token": BF16_BPT}
    options.update(kwargs)
    return evaluate_kv_guard(facts, **options)


def test_bf16_server_passes() -> None:
    verdict = judge(s9_body())
    assert verdict.ok, verdict.problems
    assert verdict.problems == []
    assert verdict.kv_dtypes == ["bf16"]
    assert verdict.bytes_per_token == pytest.approx(BF16_BPT, rel=0.01)
    assert verdict.summary().startswith("bf16 KV ok: kv_cache_dtype='bf16', ranks bf16 x1")
    verdict.raise_if_refused()


def test_bfloat16_spelling_passes() -> None:
    assert judge(s9_body(requested="bfloat16", internal=("bfloat16",))).ok


def test_explicit_fp8_is_refused() -> None:
    verdict = judge(
        s9_body(
            requested="fp8_e4m3", internal=("fp8_e4m3",), tokens=232_000, bytes_per_token=35_136
        )
    )
    assert not verdict.ok
    assert verdict.problems[0] == "kv_cache_dtype is 'fp8_e4m3', not bf16"
    assert "internal_states[0] holds 35,1" in verdict.problems[1]
    assert verdict.summary().startswith("REFUSED: kv_cache_dtype is 'fp8_e4m3', not bf16")
    with pytest.raises(ServerRefusedError, match="kv-cache-dtype bf16"):
        verdict.raise_if_refused()


def test_auto_resolved_to_fp8_internally_is_refused() -> None:
    # bytes per token consistent with bf16 so that only the dtype evidence refuses
    verdict = judge(s9_body(requested="auto", internal=("fp8_e4m3",)))
    assert not verdict.ok
    assert verdict.problems == [
        "kv_cache_dtype is 'auto' and internal_states[0] resolved it to 'fp8_e4m3'"
    ]


def test_auto_resolved_to_bf16_passes() -> None:
    verdict = judge(s9_body(requested="auto", internal=("bf16",)))
    assert verdict.ok, verdict.problems


def test_auto_left_unresolved_is_refused() -> None:
    # S9 keeps 'auto' in internal_states when auto resolves to the model dtype: not proof of bf16
    verdict = judge(s9_body(requested="auto", internal=("auto",)))
    assert verdict.problems == [
        "kv_cache_dtype is 'auto' and internal_states[0] left it unresolved as 'auto'"
    ]


def test_auto_without_internal_states_is_refused() -> None:
    verdict = judge(s9_body(requested="auto", with_internal_states=False))
    assert not verdict.ok
    assert "no internal_states" in verdict.problems[0]


def test_bf16_without_internal_states_cannot_be_verified() -> None:
    """Every SGLang release sends internal_states: an answer without them is not SGLang's, and
    its bf16 label vouches for nothing (it passed with a note)."""
    verdict = judge(s9_body(with_internal_states=False))
    assert not verdict.ok and verdict.cannot_verify
    assert verdict.problems == [
        "cannot verify the KV cache: server_info has no internal_states, which every SGLang "
        "server sends"
    ]


def test_bf16_label_with_fp8_sized_pool_is_refused() -> None:
    verdict = judge(s9_body(tokens=232_000, bytes_per_token=35_136))
    assert not verdict.ok
    assert len(verdict.problems) == 1
    assert verdict.problems[0].startswith("internal_states[0] holds 35,1")  # kvcache is rounded
    assert verdict.problems[0].endswith("B per KV token, bf16 is 70,272 (fp8 would be 35,136)")


def test_bytes_per_token_within_tolerance_passes() -> None:
    assert judge(s9_body(bytes_per_token=int(BF16_BPT * 1.08))).ok
    assert not judge(s9_body(bytes_per_token=int(BF16_BPT * 1.15))).ok


def test_unknown_bf16_figure_skips_the_comparison_with_a_note() -> None:
    verdict = judge(s9_body(tokens=232_000, bytes_per_token=35_136), bf16_bytes_per_token=None)
    assert verdict.ok
    assert any("not compared" in note for note in verdict.notes)


def test_model_mismatch_is_refused() -> None:
    verdict = judge(s9_body(model="deepseek-ai/DeepSeek-V3"))
    assert verdict.problems == [
        "server serves 'deepseek-ai/DeepSeek-V3', expected 'moonshotai/Kimi-K2.5'"
    ]


def test_no_expected_model_skips_the_model_check() -> None:
    assert judge(s9_body(model="other/model"), expected_model=None).ok


def test_dp_ranks_are_checked_one_by_one_and_grouped() -> None:
    body = s9_body(internal=("bf16", "bf16", "fp8_e4m3", "fp8_e4m3"), dp_attention=True)
    verdict = judge(body)
    assert verdict.problems == ["internal_states[2,3].kv_cache_dtype is 'fp8_e4m3', not bf16"]
    assert verdict.kv_dtypes == ["bf16", "bf16", "fp8_e4m3", "fp8_e4m3"]


def test_rank_without_dtype_is_refused() -> None:
    verdict = judge(s9_body(internal=("bf16", None), dp_attention=True))
    assert verdict.problems == ["internal_states[1] reports no kv_cache_dtype"]


def test_s23_shaped_body_passes() -> None:
    tokens = 188_000
    kvcache = round(tokens * BF16_BPT / 2**30, 3)
    body = {
        "model_path": KIMI,
        "served_model_name": "kimi",
        "dtype": "bfloat16",
        "kv_cache_dtype": "bf16",
        "tp_size": 8,
        "dp_size": 1,
        "attn_dp_size": 1,
        "enable_dp_attention": False,
        "mem_fraction_static": 0.9,
        "max_running_requests": 88,
        "context_length": 32768,
        "enable_hierarchical_cache": False,
        "launch_command": "python -m sglang.launch_server ...",
        "kv_events": None,
        "startup_time": 812.5,
        "frontend": {"kind": "http"},
        "status": "ready",
        "max_total_num_tokens": tokens,
        "max_req_input_len": 32763,
        "internal_states": [
            {
                "kv_cache_dtype": "bf16",
                "world_size": 8,
                "startup_time": 812.5,
                "effective_max_running_requests_per_dp": 88,
                "last_gen_throughput": 771.0,
                "memory_usage": {
                    "weight": 72.512,
                    "kvcache": kvcache,
                    "startup_available": 94.26,
                    "token_capacity": tokens,
                    "token_capacity_swa": None,
                    "graph": {"decode": 0.812, "prefill": 0.0},
                },
            }
        ],
        "version": "0.5.23",
    }
    facts = ServerFacts.from_server_info(body)
    assert facts.internal_states is not None
    memory = facts.internal_states[0].memory_usage
    assert memory is not None and memory.graph == 0.812  # {phase: GiB} where S9 had a number
    verdict = evaluate_kv_guard(facts, expected_model=KIMI, bf16_bytes_per_token=BF16_BPT)
    assert verdict.ok, verdict.problems
    assert facts.max_running_requests == 88
    assert facts.context_length == 32768


def test_missing_keys_read_as_none() -> None:
    facts = ServerFacts.from_server_info({})
    assert facts.kv_cache_dtype is None and facts.internal_states is None
    verdict = evaluate_kv_guard(facts, expected_model=None, bf16_bytes_per_token=None)
    assert verdict.problems == [
        "cannot verify the KV cache: server_info has no version, max_total_num_tokens, "
        "internal_states, which every SGLang server sends",
        "server_info has no kv_cache_dtype",
    ]


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda b: b.update(kv_cache_dtype=16), "server_info: kv_cache_dtype:"),
        (lambda b: b.update(model_path=["a"]), "server_info: model_path:"),
        (lambda b: b.update(internal_states={"0": {}}), "server_info: internal_states:"),
        (
            lambda b: b["internal_states"][0].update(kv_cache_dtype=2),
            "server_info: internal_states.0.kv_cache_dtype:",
        ),
        (
            lambda b: b["internal_states"][0]["memory_usage"].update(token_capacity="lots"),
            "server_info: internal_states.0.memory_usage.token_capacity:",
        ),
        (
            lambda b: b["internal_states"][0]["memory_usage"].update(kvcache="7.59"),
            "server_info: internal_states.0.memory_usage.kvcache:",
        ),
    ],
)
def test_wrong_type_for_a_guard_key_is_refused(mutate: Any, where: str) -> None:
    body = s9_body()
    mutate(body)
    with pytest.raises(ServerRefusedError) as caught:
        ServerFacts.from_server_info(body)
    assert str(caught.value).startswith(where)
    assert "\n" not in str(caught.value)


def test_wrong_type_for_an_informational_key_reads_as_none() -> None:
    body = s9_body()
    body.update(tp_size="eight", mem_fraction_static={"x": 1}, version=9)
    facts = ServerFacts.from_server_info(body)
    assert facts.tp_size is None and facts.mem_fraction_static is None and facts.version is None


def test_non_object_body_is_refused() -> None:
    with pytest.raises(ServerRefusedError, match="expected a JSON object, got list"):
        ServerFacts.from_server_info([])


def test_system_tokens_under_dp_attention_and_dcp() -> None:
    dpa = ServerFacts.from_server_info(
        s9_body(internal=("bf16",) * 4, tokens=73_600, dp_attention=True)
    )
    assert dpa.system_kv_tokens == 4 * 73_600
    dcp_body = s9_body()
    dcp_body["dcp_size"] = 8
    dcp_body["version"] = "0.5.15.post1"  # one DCP rank's rows (0.5.23: already widened)
    assert ServerFacts.from_server_info(dcp_body).system_kv_tokens == 8 * 116_000


def test_format_facts_shows_what_check_server_promises() -> None:
    body = s9_body()
    facts = ServerFacts.from_server_info(body)
    verdict = evaluate_kv_guard(facts, expected_model=KIMI, bf16_bytes_per_token=BF16_BPT)
    text = format_facts(facts, verdict)
    lines = dict(line.split("  ", 1) for line in text.splitlines())
    lines = {k.strip(): v.strip() for k, v in lines.items()}
    assert lines["model"] == KIMI
    assert lines["sglang version"] == "0.5.9 (known to this eagledata)"
    assert lines["KV cache dtype"] == "requested bf16; ranks: bf16 x1"
    assert lines["KV tokens"] == "116,000 per rank"
    assert lines["parallelism"] == "TP 8, DP 1, DP attention off"
    assert lines["hierarchical cache"] == "off"
    assert lines["mem fraction static"] == "0.85"
    assert lines["max running requests"] == "default (effective per DP rank: 2,048)"
    assert lines["bytes per KV token"].endswith("(bf16 expects 70,272)")
    assert lines["verdict"].startswith("bf16 KV ok")


def test_format_facts_of_a_refused_server_ends_with_the_reason() -> None:
    facts = ServerFacts.from_server_info(s9_body(requested="auto", internal=("fp8_e4m3",)))
    verdict = evaluate_kv_guard(facts, expected_model=KIMI, bf16_bytes_per_token=BF16_BPT)
    last = format_facts(facts, verdict).splitlines()[-1]
    assert last.startswith("verdict")
    assert "REFUSED: kv_cache_dtype is 'auto' and internal_states[0] resolved it" in last
