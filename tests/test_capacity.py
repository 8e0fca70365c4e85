"""The planner reproduces the reference runs and the arithmetic of docs/capacity.md."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from eagledata.capacity import (
    KIMI_K25,
    KIMI_K25_BF16_BYTES_PER_TOKEN,
    REFERENCE_WORKLOAD,
    RTX_PRO_6000_X8_KIMI_K25,
    Deployment,
    KVModel,
    PlanRow,
    Workload,
    decode_tok_s,
    kv_tokens_per_rank,
    plan_deployment,
    plan_profiles,
    render_plan_table,
)
from eagledata.capacity.placement import hardware_on
from eagledata.errors import ConfigError
from eagledata.profiles.loading import load_profiles
from eagledata.profiles.rigs import reference_rig
from eagledata.profiles.sections import ThroughputSection

PROFILES_DIR = Path(__file__).resolve().parents[1] / "configs" / "profiles"
HW = RTX_PRO_6000_X8_KIMI_K25
FIT = ThroughputSection()

# The real Kimi-K2.5 config.json nests the text model under text_config.
KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "model_type": "kimi_k2",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    },
    "vision_config": {"hidden_size": 1152},
}


def tp8(kv: str, mfs: float, **kwargs: int) -> Deployment:
    return Deployment(kv_cache_dtype=kv, mem_fraction_static=mfs, tp_size=8, **kwargs)


def tokens(deployment: Deployment) -> int:
    cell = KIMI_K25.cell_bytes(deployment.kv_cache_dtype, attn_tp_size=deployment.attn_tp_size)
    return kv_tokens_per_rank(HW, deployment, cell)


def plan(deployment: Deployment, workload: Workload = REFERENCE_WORKLOAD) -> PlanRow:
    return plan_deployment(
        label="x", model=KIMI_K25, hardware=HW, deployment=deployment, workload=workload
    )


# --- cell size ------------------------------------------------------------------------------


def test_kimi_cell_is_70272_bytes_bf16_and_half_in_fp8() -> None:
    assert KIMI_K25.cell_bytes("bf16") == KIMI_K25_BF16_BYTES_PER_TOKEN == 70_272
    assert KIMI_K25.cell_bytes("bfloat16") == 70_272
    assert KIMI_K25.cell_bytes("fp8_e4m3") == 35_136
    # MLA keeps one latent per token on every rank: attention TP does not divide it
    assert KIMI_K25.cell_bytes("bf16", attn_tp_size=8) == 70_272


def test_kimi_config_with_text_config_is_read() -> None:
    model = KVModel.from_config(KIMI_K25_CONFIG, name="moonshotai/Kimi-K2.5")
    assert model.attention == "mla"
    assert model.bf16_bytes_per_token == 70_272


def test_mha_config_divides_kv_heads_by_attention_tp() -> None:
    llama = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
    llama["num_key_value_heads"] = 8
    model = KVModel.from_config(llama)
    assert model.attention == "mha"
    assert model.cell_bytes("bf16") == 8 * (128 + 128) * 32 * 2
    assert model.cell_bytes("bf16", attn_tp_size=8) == 1 * 256 * 32 * 2
    assert model.cell_bytes("bf16", attn_tp_size=16) == 1 * 256 * 32 * 2  # at least one head


def test_config_without_layers_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"config\.json: num_hidden_layers"):
        KVModel.from_config({"kv_lora_rank": 512})


def test_auto_has_no_size() -> None:
    with pytest.raises(ConfigError, match="'auto' has no fixed size"):
        KIMI_K25.cell_bytes("auto")


# --- pool sizing: the reference runs ------------------------------------------------------


def test_bf16_tp8_at_085_reproduces_116k_tokens() -> None:
    assert tokens(tp8("bf16", 0.85)) == pytest.approx(116_000, rel=0.01)


def test_fp8_tp8_at_090_reproduces_376k_tokens() -> None:
    assert tokens(tp8("fp8_e4m3", 0.90)) == pytest.approx(376_029, rel=0.01)


def test_each_hundredth_of_mem_fraction_adds_14_4k_bf16_tokens() -> None:
    steps = [tokens(tp8("bf16", m / 100)) for m in range(85, 95)]
    slopes = [b - a for a, b in itertools.pairwise(steps)]
    for slope in slopes:
        assert slope == pytest.approx(14_400, abs=60)


@pytest.mark.parametrize(
    ("mfs", "expected"),
    [(0.85, 116_000), (0.88, 159_200), (0.90, 188_000), (0.92, 216_800), (0.94, 245_600)],
)
def test_bf16_table_of_section_3_4(mfs: float, expected: int) -> None:
    assert tokens(tp8("bf16", mfs)) == pytest.approx(expected, rel=0.005)


def test_dcp8_multiplies_the_system_pool_by_8() -> None:
    plain = plan(tp8("bf16", 0.85))
    dcp = plan(tp8("bf16", 0.85, dcp_size=8))
    assert dcp.tokens_per_rank == plain.tokens_per_rank  # each rank's pool is the same size
    assert dcp.system_tokens == 8 * plain.system_tokens
    assert dcp.system_tokens == pytest.approx(928_000, rel=0.01)
    assert plan(tp8("bf16", 0.88, dcp_size=8)).system_tokens == pytest.approx(1_270_000, rel=0.01)


def test_dp_attention_4_pays_replicated_weights_and_multiplies_by_4() -> None:
    row = plan(tp8("bf16", 0.88, attn_dp_size=4))
    assert row.system_tokens == 4 * row.tokens_per_rank
    assert row.system_tokens == pytest.approx(296_000, rel=0.01)
    assert plan(tp8("bf16", 0.90, attn_dp_size=4)).system_tokens == pytest.approx(411_000, rel=0.01)


def test_dp_attention_8_at_088_does_not_start() -> None:
    row = plan(tp8("bf16", 0.88, attn_dp_size=8))
    assert not row.starts
    assert row.system_tokens == 0 and row.tok_s == 0
    assert "Not enough memory" in row.notes[0]
    assert row.wall_clock_hours is None


def test_plain_tp_does_not_multiply_the_pool() -> None:
    row = plan(tp8("bf16", 0.85))
    assert row.system_tokens == row.tokens_per_rank


# --- concurrency and throughput -------------------------------------------------------------


def test_reference_runs_concurrency_and_throughput() -> None:
    bf16 = plan(tp8("bf16", 0.85))
    assert bf16.concurrent_4k == 28
    assert 35 <= bf16.steady_concurrency <= 50  # observed 35-50
    assert 400 <= bf16.tok_s <= 600  # observed 400-600
    fp8 = plan(tp8("fp8_e4m3", 0.90))
    assert fp8.concurrent_4k == 91
    assert 134 <= fp8.steady_concurrency <= 150  # observed 134-150
    assert 1_300 <= fp8.tok_s <= 1_450  # observed 1,300-1,450


def test_throughput_fit_and_band() -> None:
    assert decode_tok_s(43, FIT) == pytest.approx(43 / (0.077 + 0.00018 * 43))
    row = plan(tp8("bf16", 0.90))
    assert row.tok_s_low == pytest.approx(row.tok_s * 0.75)
    assert row.tok_s_high == pytest.approx(row.tok_s * 1.25)


def test_dcp_is_capped_by_compute_not_kv() -> None:
    row = plan(tp8("bf16", 0.85, dcp_size=8))
    assert row.steady_concurrency > 300  # the KV would hold far more
    assert row.tok_s == pytest.approx(decode_tok_s(FIT.max_running_fit, FIT))
    assert row.tok_s_low >= 1_050 and row.tok_s_high <= 1_850  # the doc says ~1,100-1,800
    assert row.recommended_max_running_requests == FIT.max_running_cap == 256
    assert any("compute-bound" in note for note in row.notes)


def test_recommendations_sit_a_bit_above_the_steady_state() -> None:
    row = plan(tp8("bf16", 0.90))
    assert row.steady_concurrency < row.recommended_concurrency <= 1.2 * row.steady_concurrency
    assert row.recommended_concurrency <= row.recommended_max_running_requests
    assert row.recommended_max_running_requests % 8 == 0


def test_a_low_max_running_requests_is_flagged_and_limits_throughput() -> None:
    capped = plan(
        Deployment(
            kv_cache_dtype="bf16", mem_fraction_static=0.90, tp_size=8, max_running_requests=32
        )
    )
    assert capped.running == 32
    assert capped.tok_s == pytest.approx(decode_tok_s(32, FIT))
    assert any("--max-running-requests 32" in note for note in capped.notes)


def test_wall_clock_of_the_reference_job() -> None:
    row = plan(tp8("bf16", 0.85))
    assert REFERENCE_WORKLOAD.total_output_tokens == 396_000_000
    assert row.wall_clock_hours is not None
    assert row.wall_clock_hours / 24 == pytest.approx(396e6 / row.tok_s / 86_400)
    assert 8.5 <= row.wall_clock_hours / 24 <= 10  # ~9.2 days at ~500 tok/s


# --- workload -------------------------------------------------------------------------------


def test_workload_from_prompt_lengths() -> None:
    lengths = list(range(1, 101))  # 1..100
    workload = Workload.from_prompt_lengths(lengths, max_new_tokens=4096, mean_output_tokens=2000)
    assert workload.num_prompts == 100
    assert workload.mean_prompt_tokens == pytest.approx(50.5)
    assert workload.p90_prompt_tokens == 90
    assert workload.max_prompt_tokens == 100
    assert workload.tokens_per_running_request == pytest.approx(50.5 + 1000 + 150)
    assert not workload.mean_output_assumed
    scaled = Workload.from_prompt_lengths(lengths, max_new_tokens=4096, num_prompts=88_000)
    assert scaled.num_prompts == 88_000
    assert scaled.mean_output_tokens == 4096 and scaled.mean_output_assumed


def test_reference_workload_holds_2700_tokens_per_running_request() -> None:
    assert REFERENCE_WORKLOAD.tokens_per_running_request == pytest.approx(2_700)


def test_empty_prompt_sample_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="prompt length sample is empty"):
        Workload.from_prompt_lengths([], max_new_tokens=10)


def test_prompts_that_do_not_fit_the_context_are_flagged() -> None:
    workload = Workload.from_prompt_lengths(
        [1_000] * 9 + [30_000], max_new_tokens=8_192, mean_output_tokens=4_500
    )
    row = plan(
        Deployment(
            kv_cache_dtype="bf16", mem_fraction_static=0.9, tp_size=8, context_length=32_768
        ),
        workload,
    )
    assert any(note.startswith("10.0% of sampled prompts") for note in row.notes)


# --- shipped profiles -----------------------------------------------------------------------


def test_shipped_profiles_carry_the_reference_preset() -> None:
    reference = reference_rig()
    for profile in load_profiles(profiles_dir=PROFILES_DIR):
        model = KVModel.from_section(profile.model)
        assert model == KIMI_K25, profile.name
        # the fit is one; a row whose layout the fit never ran is rated at a measured speed
        speed = {"step_speed": 1.0, "step_speed_hope": None}
        assert profile.throughput.model_copy(update=speed) == FIT, profile.name
        # one model, one set of memory facts: at TP8 on the reference rig, the fitted preset
        at_tp8 = profile.model_copy(update={"sglang_args": {**profile.sglang_args, "tp-size": 8}})
        assert hardware_on(reference, at_tp8) == HW.model_copy(update={"gpu": reference.gpu})


def test_plan_of_the_shipped_profiles() -> None:
    profiles = load_profiles(profiles_dir=PROFILES_DIR)
    rows = {row.profile: row for row in plan_profiles(profiles, REFERENCE_WORKLOAD)}
    assert rows["kimi-k25-reference-bf16"].system_tokens == pytest.approx(116_000, rel=0.01)
    assert rows["kimi-k25-fp8-rejected"].system_tokens == pytest.approx(376_029, rel=0.01)
    assert rows["kimi-k25-fp8-rejected"].plan_only
    tuned = rows["kimi-k25-tp8"]
    assert tuned.system_tokens > rows["kimi-k25-reference-bf16"].system_tokens
    assert rows["kimi-k25-dcp8"].system_tokens == 8 * rows["kimi-k25-dcp8"].tokens_per_rank
    # every bf16 profile is faster than the baseline it replaces
    base = rows["kimi-k25-reference-bf16"].tok_s
    for name in ("kimi-k25-tp8", "kimi-k25-dpa4", "kimi-k25-dcp8"):
        assert rows[name].tok_s > base
        # the profile's own --max-running-requests is what the planner recommends
        assert (
            rows[name].profile_max_running_requests == rows[name].recommended_max_running_requests
        )


def test_render_plan_table_fits_100_columns_and_marks_the_rejected_row() -> None:
    profiles = load_profiles(profiles_dir=PROFILES_DIR)
    text = render_plan_table(
        plan_profiles(profiles, REFERENCE_WORKLOAD), workload=REFERENCE_WORKLOAD
    )
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].startswith("workload: 88,000 prompts")
    last_block = max(i for i, line in enumerate(lines) if line.startswith("KV cache dtype"))
    header = lines[last_block - 1]
    assert header.rstrip().endswith("fp8-rejected")  # the rejected column comes last
    assert any(line.startswith("KV cache dtype") and "fp8 REJECTED" in line for line in lines)
    verdict = lines[next(i for i, line in enumerate(lines) if line.startswith("best bf16")) :]
    # rated at DCP 8's measured step cost (0.735x, the middle of 0.65-0.82x); 1,799 at 0.82x
    assert verdict[0].startswith("best bf16 profile: dcp8-eagle3, ~1,618 tok/s")
    assert verdict[1].startswith("  without speculative decoding: ")
    assert verdict[2].startswith("  with speculative decoding: ")
    assert verdict[3].startswith("rejected fp8-rejected (fp8_e4m3 KV): ~1,362 tok/s")
    # the raised goal (1.5x the rejected fp8 row) is not met at the measured DCP step cost: said
    assert verdict[-1] == (
        "  the best bf16 profile is 1.19x it, on 5 assumptions never run (its 'assumes' above)"
    )


def test_render_wraps_columns_when_narrow() -> None:
    rows = [plan(tp8("bf16", m)) for m in (0.85, 0.88, 0.90)]
    text = render_plan_table(rows, width=60)
    assert max(len(line) for line in text.splitlines()) <= 60
    assert text.count("KV cache dtype") >= 2


def test_render_of_nothing() -> None:
    assert render_plan_table([]) == "no profiles to plan"


def test_a_failed_pool_is_one_line_saying_why_not_a_column() -> None:
    rows = [
        plan(tp8("bf16", 0.88, attn_dp_size=8)),
        plan(tp8("bf16", 0.90)).model_copy(update={"profile": "y"}),
    ]
    text = render_plan_table(rows)
    lines = text.splitlines()
    header = next(line for line in lines if line.strip() and not line.startswith("KV"))
    assert header.split() == ["y"]  # the one that starts has the only column
    failed = lines.index("does not start:")
    assert lines[failed + 1].startswith(
        "  - x: KV pool -0.08 GiB per rank (11.23 GiB free per GPU after the weights, 11.31 kept"
    )
    assert "best bf16 profile: y" in text
    assert "no bf16 profile starts: nothing here may generate data" in render_plan_table(rows[:1])


def test_math_is_floor_of_gib_over_cell() -> None:
    # the formula of docs/capacity.md, computed by hand for 0.90 bf16
    gib = 21.73 - 94.26 * (1 - 0.90)
    assert tokens(tp8("bf16", 0.90)) == math.floor(gib * 2**30 / 70_272)


def test_a_dcp_row_is_rated_at_the_step_cost_it_cites_and_names_the_hope() -> None:
    """kimi-k25-dcp8-eagle3 cites vLLM's DCP 8 on the reference rig (0.65-0.82x of DCP 1): its
    central figure is rated there (0.735x, the middle), not at a TP8 step's speed, and the
    favourable end is named beside it."""
    profiles = {p.name: p for p in load_profiles(profiles_dir=PROFILES_DIR)}
    measured = profiles["kimi-k25-dcp8-eagle3"]
    as_tp8 = measured.model_copy(
        update={
            "throughput": measured.throughput.model_copy(
                update={"step_speed": 1.0, "step_speed_hope": None}
            )
        }
    )
    rated = plan_profiles([measured], REFERENCE_WORKLOAD)[0]
    hoped = plan_profiles([as_tp8], REFERENCE_WORKLOAD)[0]
    assert round(hoped.tok_s) == 2178  # the figure the row gave before: a TP8 step's speed
    assert round(rated.tok_s) == 1618
    assert rated.tok_s / 1362 < 1.5  # the raised goal is not met on the evidence
    hope = [note for note in rated.notes if "favourable end" in note]
    assert hope == [
        "steps rated at 0.735x the fitted ones (the measurement it cites); at its favourable "
        "end, 0.82x: 1,799 tok/s"
    ]
