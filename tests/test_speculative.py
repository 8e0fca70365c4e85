"""The compute lever: EAGLE-3 profiles, the step-cost model, the guard, and measured acceptance."""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from conftest import REPO, SAMPLES, make_config, read_records, sim_config
from eagledata.capacity import REFERENCE_WORKLOAD, plan_profiles
from eagledata.capacity.speculative import SPEEDUP_BATCHES, SpecModel
from eagledata.cli import app
from eagledata.errors import CanaryDriftError, ConfigError, LaunchError
from eagledata.profiles.loading import load_profiles, parse_profile
from eagledata.profiles.releases import supported_versions
from eagledata.profiles.sections import ThroughputSection
from eagledata.run import pipeline
from eagledata.rundir.status import run_status
from eagledata.server.control import LOADS_ROUTE
from eagledata.server.launch import build_launch_command
from eagledata.server.loads import parse_metrics, parse_v1_loads
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import evaluate_kv_guard
from eagledata.simserver import SimServerThread

PROFILES_DIR = REPO / "configs" / "profiles"
SPEC_PROFILES = ("kimi-k25-tp8-eagle3", "kimi-k25-dpa4-eagle3", "kimi-k25-dcp8-eagle3")
FIT = ThroughputSection()
runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("EAGLEDATA_CONFIG", raising=False)


def spec_sim(
    tokenizer_dir: str, latency_s: float = 0.0, version: str = "0.5.9", **speculative: Any
) -> SimServerThread:
    return SimServerThread(
        sim_config(
            tokenizer_dir,
            latency_s=latency_s,
            version=version,
            speculative={"accept_length": 2.5, **speculative},
        )
    )


# --- profiles -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPEC_PROFILES)
def test_eagle3_profiles_run_only_on_releases_with_the_kimi_hooks(name: str) -> None:
    """0.5.9 lacks Kimi-K2.5's EAGLE-3 hooks; 0.5.15.post1 refuses speculative decoding with DCP.
    (Every form parses with the release's own parser: tests/test_sglang_releases.py.)"""
    profile = next(p for p in load_profiles([name], PROFILES_DIR))
    assert "0.5.9" not in profile.sglang_versions and "0.5.23" in profile.sglang_versions
    assert ("0.5.15.post1" in profile.sglang_versions) == (profile.dcp_size == 1)
    assert profile.kv_cache_dtype == "bf16"
    for version in profile.sglang_versions:
        argv = profile.server_argv(version)
        for flag in ("--speculative-algorithm", "--speculative-draft-model-path"):
            assert flag in argv
        assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
        # lossless by default: the profile never relaxes acceptance, nor the draft's KV dtype
        assert not any("threshold" in arg or "draft-kv" in arg for arg in argv)


def _profile_data(name: str) -> dict[str, Any]:
    with (PROFILES_DIR / f"{name}.toml").open("rb") as handle:
        return tomllib.load(handle)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(min_release="0.5.9"), "lacks set_eagle3_layers_to_capture"),
        (lambda d: d["sglang_args"].update({"dcp-size": 8}), "refuses any speculative algorithm"),
        (lambda d: d.pop("draft"), "needs a [draft] table"),
        (lambda d: d["sglang_args"].pop("max-running-requests"), "resets it to 48"),
        (lambda d: d["sglang_args"].update({"speculative-num-draft-tokens": 6}), "num-steps + 1"),
        (lambda d: d["draft"].update(name="other/drafter"), "draft.name must equal"),
        (lambda d: d["sglang_args"].pop("speculative-algorithm"), "[draft] needs"),
    ],
    ids=["0.5.9", "dcp", "no-draft", "no-max-running", "draft-tokens", "draft-name", "no-algo"],
)
def test_speculative_profile_errors(mutate: Any, message: str) -> None:
    data = _profile_data("kimi-k25-tp8-eagle3")
    mutate(data)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_profile(data, name="bad")


@pytest.mark.parametrize(
    "extra",
    [
        ["--speculative-accept-threshold-single", "0.5"],
        ["--speculative-accept-threshold-acc=0.9"],
        ["--speculative-accept-threshold-s", "0"],
    ],
)
def test_launch_refuses_lossy_acceptance_thresholds(extra: list[str]) -> None:
    profile = load_profiles(["kimi-k25-tp8-eagle3"], PROFILES_DIR)[0]
    with pytest.raises(LaunchError, match="relaxed speculative acceptance is lossy"):
        build_launch_command(profile, extra, version="0.5.23")
    # the exact default passes through
    build_launch_command(
        profile, ["--speculative-accept-threshold-single", "1.0"], version="0.5.23"
    )


@pytest.mark.parametrize(
    "extra",
    [
        ["--speculative-draft-kv-cache-dtype", "fp8_e4m3"],
        ["--speculative-draft-kv-cache-dtype=auto"],
        ["--speculative-draft-k", "fp8_e5m2"],
    ],
)
def test_launch_refuses_a_draft_kv_cache_that_is_not_bf16(extra: list[str]) -> None:
    """0.5.23's --speculative-draft-kv-cache-dtype: the draft's KV pool is held to bf16 too."""
    profile = load_profiles(["kimi-k25-tp8-eagle3"], PROFILES_DIR)[0]
    with pytest.raises(LaunchError, match="the draft model's KV cache must be bf16 too"):
        build_launch_command(profile, extra, version="0.5.23")
    build_launch_command(profile, ["--speculative-draft-kv-cache-dtype", "bf16"], version="0.5.23")


# --- the step-cost model --------------------------------------------------------------------


def test_spec_rows_reproduce_the_model_by_hand() -> None:
    rows = {
        r.profile: r for r in plan_profiles(load_profiles(None, PROFILES_DIR), REFERENCE_WORKLOAD)
    }
    row = rows["kimi-k25-tp8-eagle3"]
    spec = row.speculative
    assert spec is not None and spec.accept_length == 2.8 and not spec.accept_length_measured
    assert "unverified" in spec.accept_length_source
    n = row.running  # 58: the 0.88 pool (159.2k) over 2,707 tokens per request (+7 for drafts)
    assert row.system_tokens == 159_197  # the 0.88 bf16 pool (docs/capacity.md)
    assert n == 58
    cycle = 0.077 + 0.00018 * n * 4 + (3 + 1) * (0.0015 + 0.000003 * n * 1)
    assert row.tok_s == pytest.approx(n * 2.8 / cycle)
    assert spec.tok_s_without == pytest.approx(n / (0.077 + 0.00018 * n))
    assert spec.speedup == pytest.approx(row.tok_s / spec.tok_s_without)
    # the draft's memory comes out of the headroom, not the target pool
    assert spec.headroom_gib == pytest.approx(94.26 * 0.12)
    assert spec.draft_kv_gib_per_gpu == pytest.approx(159_197 * 512 / 2**30)
    assert spec.headroom_after_draft_gib == pytest.approx(
        94.26 * 0.12 - 0.48 - 159_197 * 512 / 2**30 - 1.0
    )
    # at least what the tuned non-speculative profile leaves at 0.90
    assert spec.headroom_after_draft_gib >= 94.26 * 0.10
    plain = rows["kimi-k25-tp8"]
    assert plain.speculative is None and row.tok_s > plain.tok_s


def test_speedup_shrinks_as_the_batch_grows() -> None:
    model = SpecModel(accept_length=2.8, num_steps=3, eagle_topk=1, num_draft_tokens=4)
    gains = [model.speedup(n, FIT) for n in (1, *SPEEDUP_BATCHES, 400, 1000, 10_000, 10**6)]
    assert all(a > b for a, b in itertools.pairwise(gains))
    assert gains[0] > 2.0  # large at small batch: the weight-read floor dominates
    # toward L b / (k b + (steps + 1) d_n topk), about L / k: at huge batches speculation costs
    assert gains[-1] == pytest.approx(2.8 * 0.00018 / (4 * 0.00018 + 4 * 0.000003), rel=0.01)
    crossover = next(n for n in range(1, 10_000) if model.speedup(n, FIT) < 1)
    assert 500 < crossover < 700  # far above the ~150 the throughput fit holds to
    # an acceptance of 1 (nothing accepted) is never a gain
    assert SpecModel(1.0, 3, 1, 4).speedup(1, FIT) < 1


def test_accept_length_flag_and_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--json", "--accept-length", "2.0"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {row["profile"]: row for row in doc["profiles"]}
    assert set(rows) >= {*SPEC_PROFILES, "kimi-k25-tp8", "kimi-k25-fp8-rejected"}
    for row in rows.values():
        for key in ("kv_cache_dtype", "kv_tokens", "running", "tok_s", "speculative", "status"):
            assert key in row
        assert row["status"] in ("measured", "arithmetic", "unverified")
    assert rows["kimi-k25-tp8"]["speculative"] is None
    spec = rows["kimi-k25-tp8-eagle3"]["speculative"]
    assert spec["accept_length"] == 2.0 and spec["accept_length_source"].startswith("--accept")
    assert rows["kimi-k25-fp8-rejected"]["kv_cache_dtype"] == "fp8_e4m3"
    assert rows["kimi-k25-reference-bf16"]["status"] == "measured"
    assert doc["best"]["rejected"] == "kimi-k25-fp8-rejected"
    assert doc["best"]["bf16_with_speculative"] in SPEC_PROFILES
    assert doc["best"]["bf16_without_speculative"] not in SPEC_PROFILES


def test_plan_text_shows_both_best_rows_their_status_and_what_settles_them() -> None:
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "  without speculative decoding: " in out and "  with speculative decoding: " in out
    assert "speedup over the same batch without speculation, by running requests: 8: " in out
    written_for_the_reference = [
        p for p in load_profiles(None, PROFILES_DIR) if p.rigs is None or "rtx-pro-6000x8" in p.rigs
    ]
    assert out.count("settles it: ") == len(written_for_the_reference)


# --- the guard and check-server --------------------------------------------------------------


def _facts(url: str) -> ServerFacts:
    return ServerFacts.from_server_info(httpx.get(f"{url}/server_info").json())


def test_check_server_shows_the_speculative_settings(tokenizer_dir: str) -> None:
    with spec_sim(tokenizer_dir) as sim:
        result = runner.invoke(app, ["check-server", sim.url, "--bf16-bytes-per-token", "70272"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("speculative decoding"))
    assert "EAGLE3, draft AQ-MedAI/Kimi-K25-eagle3, 3 steps x top-k 1, 4 draft tokens" in line
    assert "acceptance not measured yet" in line


@pytest.mark.parametrize(
    ("kv", "speculative", "refusal"),
    [
        ("auto", {"draft_kv_cache_dtype": "fp8_e4m3"}, "resolved it to 'fp8_e4m3'"),
        ("auto", {}, "the draft model resolves it from its own checkpoint"),
        ("bf16", {"accept_threshold_single": 0.5}, "threshold_single is 0.5: relaxed"),
        ("bf16", {"accept_threshold_acc": 0.8}, "threshold_acc is 0.8: relaxed"),
    ],
    ids=["draft-fp8", "auto", "single", "acc"],
)
def test_guard_refuses_a_lossy_or_non_bf16_speculative_server(
    tokenizer_dir: str, kv: str, speculative: dict[str, Any], refusal: str
) -> None:
    with SimServerThread(
        sim_config(tokenizer_dir, kv_cache_dtype=kv, speculative=speculative)
    ) as sim:
        facts = _facts(sim.url)
        result = runner.invoke(app, ["check-server", sim.url])
    verdict = evaluate_kv_guard(facts, expected_model=None, bf16_bytes_per_token=70_272)
    assert not verdict.ok
    assert any(refusal in problem for problem in verdict.problems), verdict.problems
    assert result.exit_code == 4


def test_a_clean_speculative_server_passes(tokenizer_dir: str) -> None:
    with spec_sim(tokenizer_dir) as sim:
        verdict = evaluate_kv_guard(
            _facts(sim.url), expected_model="moonshotai/Kimi-K2.5", bf16_bytes_per_token=70_272
        )
    assert verdict.ok, verdict.problems
    assert any("draft KV follows kv_cache_dtype" in note for note in verdict.notes)


# --- measured, not assumed --------------------------------------------------------------------


@pytest.mark.parametrize("version", supported_versions())
def test_records_keep_verify_counts_and_status_measures_acceptance(
    tokenizer_dir: str, tmp_path: Path, version: str
) -> None:
    """In every release's shapes (a server of 0.5.9 could not run EAGLE-3 on Kimi-K2.5, but its
    reporting is what eagledata reads of other models)."""
    out = tmp_path / "run"
    with spec_sim(tokenizer_dir, latency_s=0.05, version=version) as sim:  # long enough to sample
        config = make_config(
            [sim.url],
            out,
            generation={"max_new_tokens": 200},
            load={"telemetry_interval_s": 0.05, "poll_interval_s": 0.05},
            run={"concurrency": 4},
        )
        summary = pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
        facts = _facts(sim.url)
        metrics = httpx.get(f"{sim.url}/metrics").text
        loads = parse_v1_loads(httpx.get(f"{sim.url}{LOADS_ROUTE}").json())
        # the speculative section comes only when asked for (include=spec), in every release
        bare = httpx.get(f"{sim.url}/v1/loads?include=core,memory,queues").json()
        assert all("speculative" not in entry for entry in bare["loads"])
        gauges = parse_metrics(metrics)
    records = read_records(out)
    assert summary.written == len(records) > 10
    counted = [r for r in records if r["spec_verify_ct"] > 0]
    assert counted, "the simulated server reports verify counts"
    for record in records:
        if record["completion_tokens"] <= 1:
            assert record["spec_verify_ct"] == 0  # no verify step ran: the field's none
        else:
            # SGLang's per-answer acceptance lies between 1 and the draft tokens per step
            assert 1 <= record["completion_tokens"] / record["spec_verify_ct"] <= 4 + 1
    tokens = sum(r["completion_tokens"] for r in counted)
    verify = sum(r["spec_verify_ct"] for r in counted)
    measured = tokens / verify
    assert 2.0 < measured < 3.0  # around the configured 2.5 (the prefill token adds a little)
    status = run_status(out)
    assert status.speculative is not None
    assert status.speculative.startswith(f"acceptance {measured:.2f} tokens/verify step")
    assert "spec:     acceptance" in status.render()
    spec_json = status.to_json()["speculative"]
    assert spec_json["accept_length"] == pytest.approx(measured)
    assert spec_json["records"] == len(counted) and spec_json["verify_ct"] == verify
    # the server's own figure, what plan --server reads, agrees with the records
    assert facts.speculative is not None
    assert facts.speculative.accept_length == pytest.approx(measured)
    assert "sglang:spec_accept_length{" in metrics
    # telemetry: the server's figure, sampled while the run went on (0 before the first verify)
    assert loads is not None and loads.ranks[0].spec_accept_length == pytest.approx(measured)
    assert gauges is not None and gauges.ranks[0].spec_accept_length == pytest.approx(measured)
    telemetry = [orjson.loads(line) for line in (out / "telemetry.jsonl").read_bytes().splitlines()]
    sampled = [t["spec_accept_length"] for t in telemetry if t["spec_accept_length"] is not None]
    assert sampled and all(1.0 < value < 4.0 for value in sampled)


def test_plan_server_uses_the_measured_acceptance(tokenizer_dir: str, tmp_path: Path) -> None:
    with spec_sim(tokenizer_dir, accept_length=2.2) as sim:
        config = make_config([sim.url], tmp_path / "run", generation={"max_new_tokens": 200})
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
        measured = _facts(sim.url).speculative
        result = runner.invoke(
            app,
            ["plan", "--json", "--server", sim.url, "--profile", "kimi-k25-tp8-eagle3"],
        )
    assert result.exit_code == 0, result.output
    assert measured is not None and measured.accept_length is not None
    rows = json.loads(result.output)["profiles"]
    live, profile = rows[0], rows[1]
    assert live["profile"] == f"live {sim.url}" and live["status"] == "measured"
    for row in (live, profile):
        spec = row["speculative"]
        assert spec["accept_length"] == pytest.approx(measured.accept_length)
        assert spec["accept_length_measured"] is True
        assert spec["accept_length_source"] == f"measured on {sim.url}"


def test_a_plain_server_has_no_speculative_keys(sim: SimServerThread) -> None:
    body = httpx.post(
        f"{sim.url}/generate",
        json={"input_ids": [11, 12, 13], "sampling_params": {"max_new_tokens": 20}},
    ).json()
    assert not any(key.startswith("spec_") for key in body["meta_info"])
    assert _facts(sim.url).speculative is None


# --- losslessness is checked, not taken on faith ---------------------------------------------


@pytest.mark.slow
def test_the_canary_runs_unchanged_against_a_speculative_server(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Baseline on a plain server, the rest of the run on a speculative one: the canary compares
    like with like and passes; a speculative server that is lossy (degraded answers while it
    reports bf16 and exact thresholds, so the KV guard passes it) drifts."""
    from test_canary import NOISY, canary_config, ledger

    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as plain:
        config = canary_config(plain.url, out)
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    shards = sorted((out / "shards").glob("*.jsonl"))
    shards[-1].unlink()  # work left for the speculative server
    before = len(read_records(out))
    spec = {"speculative": {"accept_length": 2.5}}
    with SimServerThread(sim_config(tokenizer_dir, **NOISY, **spec)) as fast:
        summary = pipeline.resume(out, server_urls=[fast.url], progress=False)
    assert summary.left == 0 and summary.failed == 0
    records = read_records(out)
    assert len(records) == 40 > before
    assert any(r["spec_verify_ct"] for r in records if r["server"] == fast.url)
    checks = [e for e in ledger(out) if e["server"] == fast.url and e["kind"] == "check"]
    assert checks and {e["verdict"] for e in checks} == {"pass"}

    shards = sorted((out / "shards").glob("*.jsonl"))
    shards[-1].unlink()
    kept = read_records(out)
    with SimServerThread(sim_config(tokenizer_dir, degraded=True, **NOISY, **spec)) as lossy:
        facts = _facts(lossy.url)
        assert evaluate_kv_guard(facts, expected_model=None, bf16_bytes_per_token=70_272).ok
        with pytest.raises(CanaryDriftError):
            pipeline.resume(out, server_urls=[lossy.url], progress=False)
    assert read_records(out) == kept  # nothing from the lossy server landed
    assert ledger(out)[-1]["verdict"] == "drift"
