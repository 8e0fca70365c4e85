"""Issue 26: the rigs teams have. ``plan --rig NAME`` puts the profiles on the GPUs of
``configs/rigs.toml``, says which start and the pool each gives, the best bf16 row against that
rig's fp8 row, and names every assumption that carries the reference's measurements over."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import REPO
from eagledata.capacity import REFERENCE_WORKLOAD, render_plan_table
from eagledata.capacity.placement import hardware_on, place
from eagledata.capacity.planner import plan_profile, plan_profiles
from eagledata.capacity.planning import profiles_for
from eagledata.cli import app
from eagledata.errors import ConfigError
from eagledata.profiles.loading import load_profile, load_profiles, parse_profile
from eagledata.profiles.rigs import get_rig, reference_rig, rig_names, rigs

runner = CliRunner()
PROFILES_DIR = REPO / "configs" / "profiles"
ISSUE_RIGS = ["rtx-pro-6000x8", "h100x8", "h100x16", "h200x8", "b200x8"]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("EAGLEDATA_CONFIG", raising=False)


def plan_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["plan", "--json", *args])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def profile(name: str) -> Any:
    return load_profile(name, PROFILES_DIR)


# --- the rigs file ------------------------------------------------------------------------------


def test_the_rigs_file_holds_the_rigs_the_issue_names_the_reference_first() -> None:
    assert rig_names() == ISSUE_RIGS
    assert reference_rig().name == "rtx-pro-6000x8" and reference_rig().evidence == "measured"
    memory = {name: round(rig.gpu_memory_gib, 2) for name, rig in rigs().items()}
    assert memory == {
        "rtx-pro-6000x8": 95.59,
        "h100x8": 79.65,
        "h100x16": 79.65,
        "h200x8": 140.4,
        "b200x8": 179.06,
    }
    assert {name: rig.gpus for name, rig in rigs().items()}["h100x16"] == 16
    for rig in rigs().values():
        if rig.name != "rtx-pro-6000x8":  # nothing measured on these: each says what it assumes
            assert rig.evidence == "unverified" and rig.assumptions, rig.name
            # the CUDA and NCCL context the reference's fit implies (95.59 - 94.26 = 1.33 GiB)
            assert rig.gpu_memory_gib - rig.pre_free_gib == pytest.approx(1.33, abs=0.01)


def test_an_unknown_rig_is_one_line_naming_the_known_ones() -> None:
    result = runner.invoke(app, ["plan", "--rig", "a100x8"])
    assert result.exit_code != 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "eagledata: error: --rig: unknown rig 'a100x8' (known: rtx-pro-6000x8, h100x8, h100x16, "
        "h200x8, b200x8; they live in configs/rigs.toml)"
    ]


# --- the arithmetic of a profile on a rig ---------------------------------------------------------


def test_on_the_reference_rig_nothing_is_carried_over() -> None:
    tp8 = profile("kimi-k25-tp8")
    placed = place(tp8, reference_rig())
    assert placed.servers == 1 and placed.assumptions == []
    assert placed.profile.throughput == tp8.throughput  # the fit as measured
    hardware = hardware_on(reference_rig(), tp8)
    assert (hardware.pre_free_gib, hardware.post_free_gib) == (94.26, 21.73)


def test_tp16_halves_the_split_weights_and_keeps_the_replicated_ones() -> None:
    tp16 = profile("kimi-k25-h100x16")
    # 3.66 GiB on every GPU + (72.53 - 3.66) x 8 / 16
    assert tp16.model.resident_gib_at(16) == pytest.approx(3.66 + 68.87 / 2, abs=1e-4)
    hardware = hardware_on(get_rig("h100x16"), tp16)
    assert hardware.post_free_gib == pytest.approx(78.32 - 38.095, abs=1e-3)


def test_the_step_time_fit_is_carried_over_by_bandwidth_and_compute_and_says_so() -> None:
    placed = place(profile("kimi-k25-h200-tp8"), get_rig("h200x8"))
    fit = placed.profile.throughput
    assert fit.step_base_s == pytest.approx(0.077 * 1.792 / 4.8)
    assert fit.step_per_request_s == pytest.approx(0.00018 * 1.792 / 4.8)
    assert fit.max_running_fit == round(150 * 989 / 504)  # 294
    assert fit.max_running_cap % 8 == 0
    text = " | ".join(placed.assumptions)
    assert "by memory bandwidth: a and b x0.373 (1.792 / 4.8 TB/s" in text
    assert "compute-bound at ~294 running" in text
    assert "free memory before the weights 139.07 GiB" in text
    assert all("unverified" in a or "context" in a for a in placed.assumptions)


def test_a_server_over_two_nodes_fits_only_a_rig_with_two_nodes() -> None:
    tp16 = profile("kimi-k25-h100x16")
    assert (tp16.nnodes, tp16.gpus, tp16.gpus_per_node) == (2, 16, 8)
    misfit = place(tp16, get_rig("h200x8"))
    assert not misfit.fits
    assert misfit.misfit == "needs 16 GPUs on 2 nodes of 8; h200x8 has 1 node"
    row = plan_profile(tp16, REFERENCE_WORKLOAD, rig=get_rig("h200x8"))
    assert not row.starts and row.servers == 0 and row.tok_s == 0
    assert row.notes == [f"does not fit h200x8: {misfit.misfit}"]
    on_two = place(tp16, get_rig("h100x16"))
    assert on_two.servers == 1
    assert any(
        a.startswith("TP16 over 2 nodes steps as fast as TP8 on one") for a in on_two.assumptions
    )


def test_a_rig_with_room_for_several_servers_counts_them_together() -> None:
    """One TP8 server per node, one job over them behind sglang-router."""
    h200 = get_rig("h200x8")
    two_nodes = h200.model_copy(update={"name": "h200x16", "nodes": 2})
    tp8 = profile("kimi-k25-h200-tp8")
    one = plan_profile(tp8, REFERENCE_WORKLOAD, rig=h200)
    two = plan_profile(tp8, REFERENCE_WORKLOAD, rig=two_nodes)
    assert (two.servers, two.gpus, two.nodes) == (2, 16, 1)
    assert two.parallelism == "2x TP8"
    assert two.system_tokens == 2 * one.system_tokens
    assert two.tok_s == pytest.approx(2 * one.tok_s)
    assert two.recommended_max_running_requests == one.recommended_max_running_requests
    assert two.recommended_concurrency == 2 * one.recommended_concurrency
    assert any("behind sglang-router" in note for note in two.notes)


# --- plan --rig, for each rig -------------------------------------------------------------------


@pytest.mark.parametrize("rig", ISSUE_RIGS)
def test_plan_json_rows_carry_rig_nodes_and_starts(rig: str) -> None:
    document = plan_json("--rig", rig)
    assert document["rig"]["name"] == rig
    rows = document["profiles"]
    assert rows
    for row in rows:
        assert row["rig"] == rig
        assert isinstance(row["nodes"], int) and row["nodes"] >= 1
        assert isinstance(row["starts"], bool)
        for assumption in row["rig_assumptions"]:
            assert assumption in row["assumptions"]  # every one of the rig's is the row's too
        if rig != "rtx-pro-6000x8":
            assert row["status"] == "unverified", row["profile"]  # never measured on this rig
            assert row["rig_assumptions"], row["profile"]


@pytest.mark.parametrize("rig", ISSUE_RIGS)
def test_plan_text_heads_with_the_rig_and_names_every_assumption(rig: str) -> None:
    result = runner.invoke(app, ["plan", "--rig", rig])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"\nrig {rig}: " in out
    for row in plan_json("--rig", rig)["profiles"]:
        if row["starts"]:
            for assumption in row["assumptions"]:
                # said once under the rig, or in the row; wrapped at 100 columns
                assert " ".join(assumption.split())[:60] in " ".join(out.split()), assumption
        else:
            assert f"{row['profile'].removeprefix('kimi-k25-')}" in out.split("does not start")[1]


def test_the_reference_plan_is_what_it_was_before_rigs() -> None:
    assert plan_json() == plan_json("--rig", "rtx-pro-6000x8")
    rows = {row["profile"]: row for row in plan_json()["profiles"]}
    assert set(rows) == {
        "kimi-k25-dcp8",
        "kimi-k25-dcp8-eagle3",
        "kimi-k25-dpa4",
        "kimi-k25-dpa4-eagle3",
        "kimi-k25-fp8-rejected",
        "kimi-k25-reference-bf16",
        "kimi-k25-tp8",
        "kimi-k25-tp8-eagle3",
    }
    assert rows["kimi-k25-reference-bf16"]["kv_tokens"] == pytest.approx(116_000, rel=0.01)
    assert rows["kimi-k25-fp8-rejected"]["kv_tokens"] == pytest.approx(376_029, rel=0.01)
    assert rows["kimi-k25-reference-bf16"]["status"] == "measured"
    assert all(row["rig_assumptions"] == [] for row in rows.values())


def test_h100x8_cannot_hold_the_model_with_a_bf16_pool() -> None:
    document = plan_json("--rig", "h100x8")
    rows = document["profiles"]
    # no profile is written for it: the reference's are planned, carried over; none starts
    assert rows and not any(row["starts"] for row in rows)
    assert all(row["carried_over"] for row in rows if not row["plan_only"])
    assert document["best"]["bf16"] is None and document["best"]["rejected"] is None
    tp8 = next(row for row in rows if row["profile"] == "kimi-k25-tp8")
    assert tp8["notes"][0].startswith(
        "KV pool -2.04 GiB per rank (5.79 GiB free per GPU after the weights, 7.83 kept back"
    )
    out = runner.invoke(app, ["plan", "--rig", "h100x8"]).output
    assert "no profile is written for h100x8" in out
    assert out.rstrip().endswith("no bf16 profile starts on h100x8: nothing here may generate data")


def test_h100x16_plans_tp16_over_two_nodes_against_its_own_fp8_row() -> None:
    document = plan_json("--rig", "h100x16")
    rows = {row["profile"]: row for row in document["profiles"]}
    assert set(rows) == {
        "kimi-k25-h100x16",
        "kimi-k25-h100x16-dcp8",
        "kimi-k25-h100x16-eagle3",
        "kimi-k25-h100x16-fp8-rejected",
    }
    assert all(row["nodes"] == 2 and row["starts"] for row in rows.values())
    assert rows["kimi-k25-h100x16"]["kv_tokens"] == pytest.approx(471_000, rel=0.01)
    assert document["best"]["rejected"] == "kimi-k25-h100x16-fp8-rejected"
    best = rows[document["best"]["bf16"]]
    assert best["tok_s"] >= rows["kimi-k25-h100x16-fp8-rejected"]["tok_s"]


@pytest.mark.parametrize("rig", ["h200x8", "b200x8"])
def test_one_node_rigs_with_more_memory_hold_several_times_the_reference_pool(rig: str) -> None:
    document = plan_json("--rig", rig)
    rows = {row["profile"]: row for row in document["profiles"]}
    short = rig.removesuffix("x8")
    assert set(rows) == {f"kimi-k25-{short}-{c}" for c in ("tp8", "tp8-eagle3", "dpa8", "dcp8")} | {
        "kimi-k25-fp8-rejected"
    }
    assert all(row["starts"] for row in rows.values())
    tp8 = rows[f"kimi-k25-{short}-tp8"]
    assert tp8["kv_tokens"] > 6 * 116_000  # "several times the reference's"
    best, fp8 = document["best"]["bf16"], rows["kimi-k25-fp8-rejected"]
    assert best is not None and rows[best]["tok_s"] >= 0.99 * fp8["tok_s"]
    # each tuned profile's --max-running-requests is what the plan recommends for it
    for row in rows.values():
        if not row["plan_only"]:
            assert row["profile_max_running_requests"] == row["recommended_max_running_requests"]


def test_the_plan_decides_h200_and_b200_differently() -> None:
    """On H200 the TP8 pool already holds the batch at which decode turns compute-bound, so the
    drafter is the lever; B200's knee is further out, and DCP's pool reaches it."""
    assert plan_json("--rig", "h200x8")["best"]["bf16"] == "kimi-k25-h200-tp8-eagle3"
    assert plan_json("--rig", "b200x8")["best"]["bf16"] == "kimi-k25-b200-dcp8"
    text = runner.invoke(app, ["plan", "--rig", "b200x8"]).output
    assert "as fast: b200-dpa8" in text  # the tie is said, the row on fewer assumptions named


def test_profiles_for_a_rig_and_those_written_for_others() -> None:
    profiles = load_profiles(profiles_dir=PROFILES_DIR)
    planned, elsewhere = profiles_for(get_rig("h200x8"), profiles)
    assert {p.name for p in planned} == {
        "kimi-k25-h200-tp8",
        "kimi-k25-h200-tp8-eagle3",
        "kimi-k25-h200-dpa8",
        "kimi-k25-h200-dcp8",
        "kimi-k25-fp8-rejected",
    }
    assert len(planned) + len(elsewhere) == len(profiles)
    text = render_plan_table(
        plan_profiles(planned, REFERENCE_WORKLOAD, rig=get_rig("h200x8")),
        rig=get_rig("h200x8"),
        elsewhere=elsewhere,
    )
    assert "written for other rigs (plan --rig NAME): kimi-k25-b200-dcp8 (b200x8)," in text


def test_a_profile_named_on_another_rig_is_planned_there_marked_carried_over() -> None:
    rows = plan_json("--rig", "rtx-pro-6000x8", "--profile", "kimi-k25-h200-tp8")["profiles"]
    assert len(rows) == 1 and rows[0]["carried_over"] and rows[0]["status"] == "unverified"
    assert rows[0]["status_text"].startswith("written for h200x8, carried over; there: ")


# --- the profile file ---------------------------------------------------------------------------


def _profile_data(name: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads((PROFILES_DIR / f"{name}.toml").read_text())


def test_a_profile_names_only_rigs_the_rigs_file_has() -> None:
    data = {**_profile_data("kimi-k25-tp8"), "rigs": ["a100x8"]}
    with pytest.raises(ConfigError) as caught:
        parse_profile(data, name="bad", source="bad.toml")
    assert str(caught.value) == (
        "bad.toml: rigs: 'a100x8' is not a rig of configs/rigs.toml (rtx-pro-6000x8, h100x8, "
        "h100x16, h200x8, b200x8)"
    )


def test_a_profile_with_the_old_hardware_table_is_told_where_it_went() -> None:
    data = {**_profile_data("kimi-k25-tp8"), "hardware": {"gpu": "x", "num_gpus": 8}}
    with pytest.raises(ConfigError, match=r"\[hardware\]: the GPUs now live in configs/rigs\.toml"):
        parse_profile(data, name="old", source="old.toml")


@pytest.mark.parametrize(
    ("key", "fix"),
    [
        ("node-rank", "launch-server --node-rank R"),
        ("dist-init-addr", "launch-server --dist-init-addr HOST:PORT"),
    ],
)
def test_which_node_a_command_is_for_is_never_the_profiles(key: str, fix: str) -> None:
    data = _profile_data("kimi-k25-h100x16")
    data["sglang_args"] = {**data["sglang_args"], key: "1"}
    with pytest.raises(ConfigError, match=fix):
        parse_profile(data, name="bad", source="bad.toml")


def test_nodes_must_share_the_gpus_evenly() -> None:
    data = _profile_data("kimi-k25-h100x16")
    data["sglang_args"] = {**data["sglang_args"], "nnodes": 3}
    with pytest.raises(ConfigError, match="3 nodes cannot share 16 GPUs evenly"):
        parse_profile(data, name="bad", source="bad.toml")


def test_the_rigs_tables_in_the_docs_are_the_plans() -> None:
    """docs/throughput.md's rigs tables are written by scripts/rig_table.py from the plan."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rig_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_live_servers_row_names_the_rig_and_its_nodes(tokenizer_dir: str) -> None:
    from conftest import sim_config
    from eagledata.simserver import SimServerThread

    with SimServerThread(sim_config(tokenizer_dir, max_total_num_tokens=150_000)) as sim:
        document = plan_json(
            "--rig", "h200x8", "--profile", "kimi-k25-h200-tp8", "--server", sim.url
        )
    live = document["profiles"][0]
    assert live["profile"] == f"live {sim.url}"
    assert (live["rig"], live["nodes"], live["starts"], live["kv_tokens"]) == (
        "h200x8",
        1,
        True,
        150_000,
    )


def test_the_label_a_plan_shows_is_a_profile_name_plan_accepts() -> None:
    """The reference table heads kimi-k25-tp8's column 'tp8' under 'profiles kimi-k25-*'."""
    out = runner.invoke(app, ["plan"]).output
    assert "profiles kimi-k25-*" in out and " tp8 " in out
    rows = plan_json("--profile", "tp8")["profiles"]
    assert [row["profile"] for row in rows] == ["kimi-k25-tp8"]
    # on h200x8 the table's labels are its own profiles' (h200-tp8 for kimi-k25-h200-tp8)
    rows = plan_json("--rig", "h200x8", "--profile", "h200-tp8")["profiles"]
    assert [row["profile"] for row in rows] == ["kimi-k25-h200-tp8"]


def test_a_profile_named_for_another_rig_points_at_those_written_for_this_one() -> None:
    out = runner.invoke(app, ["plan", "--rig", "h200x8", "--profile", "kimi-k25-tp8"]).output
    assert "no profile is written for h200x8" not in out
    assert (
        "the profiles named are written for other rigs, carried over as they are; written for "
        "h200x8: kimi-k25-h200-dcp8, kimi-k25-h200-dpa8, kimi-k25-h200-tp8, "
        "kimi-k25-h200-tp8-eagle3"
    ) in " ".join(line.strip() for line in out.splitlines())


def test_on_h100x8_each_profile_gets_its_own_way_out_and_h100x16_is_named() -> None:
    rows = {row["profile"]: row for row in plan_json("--rig", "h100x8")["profiles"]}
    tp8, dpa4 = rows["kimi-k25-tp8"]["notes"][0], rows["kimi-k25-dpa4"]["notes"][0]
    # TP8 has room once the fraction passes 0.93; no DP attention to drop
    assert tp8.endswith(
        "raise --mem-fraction-static above 0.93 (at 0.95: 1.87 GiB per rank, little room for "
        "activations), or spread the weights over more GPUs"
    )
    # DPA4 has 0.19 GiB left after the weights: no fraction helps, dropping DP attention may
    assert dpa4.endswith(
        "drop DP attention (it replicates 5.60 GiB more per GPU), or spread the weights over "
        "more GPUs"
    )
    out = " ".join(
        line.strip() for line in runner.invoke(app, ["plan", "--rig", "h100x8"]).output.splitlines()
    )
    assert (
        "more H100 SXM 80GB HBM3 GPUs: plan --rig h100x16 (16 GPUs; written for it: "
        "kimi-k25-h100x16, kimi-k25-h100x16-dcp8, kimi-k25-h100x16-eagle3)"
    ) in out


def test_an_eagle3_profile_names_the_drafter_it_launches() -> None:
    """A note naming a drafter names the one --speculative-draft-model-path launches (and the
    planner's [draft] is that one too)."""
    import tomllib

    for path in sorted(PROFILES_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        launched = data.get("sglang_args", {}).get("speculative-draft-model-path")
        if launched is None:
            continue
        assert data["draft"]["name"] == launched, path.name
        for note in data.get("notes", []):
            if "drafter" in note:
                assert launched in note.split(";")[0], (path.name, note)
