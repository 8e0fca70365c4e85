"""Every supported SGLang release proves, with its own code, what eagledata claims about it.

For each release of ``configs/sglang-releases/`` (``tests/sglangkit.py`` installs it, its own
code run by ``tests/sglang_probe.py`` on a CPU machine):

* every profile, on every release it claims, parses with that release's ``ServerArgs``
  parser (an argparse error fails; a deprecation it logs is reported as a warning), its DP
  attention and DCP resolve with the release's own hooks to the layout the profile means, and
  eagledata's ``ServerFacts`` reads the ``/server_info`` fields those give as that layout;
* every profile the release has no form for is refused by the release itself, for the reason its
  file gives (an unknown flag, a resolution step, the model class lacking a hook);
* every flag the file calls missing is absent from the parser, every spelling it renders exists;
* every ``/generate`` body eagledata sends (captured from a run with the canary against the
  simulator in that release's shapes) passes the release's request types with no key dropped,
  pinned to the rank eagledata meant;
* every ``/metrics`` name eagledata reads is one the release's metrics collectors register;
* every option that sets a KV cache dtype, in every spelling and prefix argparse takes, is
  refused by ``launch-server`` for every choice but bf16;
* the version matrix in ``docs/sglang.md`` is the one these reports give.

The first run builds the releases' folders (see the README's test section for the time); a skip
only when the package registry cannot be reached.
"""

from __future__ import annotations

import concurrent.futures
import re
import warnings
from pathlib import Path
from typing import Any

import orjson
import pytest

import sglangkit
from conftest import REPO, SAMPLES, make_config, sim_config
from eagledata.errors import LaunchError
from eagledata.profiles.loading import load_profiles
from eagledata.profiles.profile import Profile
from eagledata.profiles.releases import Release, releases, unsupported
from eagledata.run import pipeline
from eagledata.server import client as client_module
from eagledata.server.launch_args import check_server_args
from eagledata.server.loads import METRIC_NAMES
from eagledata.server.serverfacts import BOTH_PIN_FIELDS, ServerFacts
from eagledata.simserver import SimServerThread

pytestmark = pytest.mark.slow  # each SGLang release's own environment, probed

PROFILES = load_profiles(profiles_dir=REPO / "configs" / "profiles")
RELEASES = releases()
MATRIX_DOC = REPO / "docs" / "sglang.md"
VOCAB = 163_840  # Kimi-K2.5's, what SamplingParams.verify checks stop ids against
GENERATION = {"max_new_tokens": 16, "temperature": 0.7, "top_p": 0.95, "top_k": 20, "min_p": 0.05}


class SGLangDeprecation(UserWarning):
    """A launch flag a release still takes but logs as deprecated."""


# --- the bodies eagledata sends ---------------------------------------------------------------


def _shape(body: dict[str, Any]) -> str:
    """One name per kind of body: its keys, its sampling keys, its pin."""
    params = ",".join(sorted(body.get("sampling_params") or {}))
    keys = ",".join(sorted(k for k in body if k not in ("input_ids", "sampling_params", "rid")))
    return f"[{keys}] sampling[{params}]" + (" rid" if "rid" in body else "")


def captured_bodies(tokenizer_dir: str, tmp_path: Path, version: str) -> dict[str, Any]:
    """Every kind of ``/generate`` body a run with the canary sends to a DP-attention server of
    ``version`` (the simulator in its shapes), one of each kind."""
    seen: dict[str, Any] = {}
    real = client_module.read_capped

    async def recording(pool: Any, url: str, body: bytes, bound: int) -> Any:
        if url.endswith("/generate"):
            decoded = orjson.loads(body)
            seen.setdefault(_shape(decoded), decoded)
        return await real(pool, url, body, bound)

    # Sized so the simulator's batch noise stays under the canary's mean_shift floor: with 4
    # references of 24 tokens and a baseline of two scorings, a healthy server drifted in 4 runs
    # of 400, and CI saw one. Each release's run here sends every kind of body all the same.
    canary = {"enabled": True, "prompts": 8, "reference_tokens": 256, "probes": 2,
              "probe_tokens": 8, "top_logprobs": 5, "baseline_idle_runs": 2,
              "baseline_load_runs": 1, "load_requests": 2, "period_s": 0.2}  # fmt: skip
    dp = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}
    client_module.read_capped = recording  # type: ignore[assignment]
    try:
        with SimServerThread(sim_config(tokenizer_dir, version=version, **dp)) as sim:
            config = make_config(
                [sim.url],
                tmp_path / f"run-{version}",
                generation=GENERATION,
                run={"concurrency": "auto", "limit": 12},
                canary=canary,
            )
            pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    finally:
        client_module.read_capped = real  # type: ignore[assignment]
    return seen


# --- one probe per release, shared by the module's tests ----------------------------------------


HEAD = "10.0.0.1:50000"
"""The node-rank-0 address every node of a multi-node profile is given (``--dist-init-addr``)."""


def forced_argv(profile: Profile, release: Release, rank: int = 0) -> list[str]:
    """The command of node ``rank`` (a multi-node profile's, with its place), as launch-server
    builds it."""
    return profile.render(release, profile.node(rank, HEAD) if profile.nnodes > 1 else None)


def node_key(state: str, profile: Profile, rank: int) -> str:
    return f"{state}:{profile.name}" + (f"@node{rank}" if rank else "")


def build_job(release: Release, bodies: dict[str, Any]) -> dict[str, Any]:
    argv = {}
    for profile in PROFILES:
        state = "claimed" if release.version in profile.sglang_versions else "forced"
        for rank in range(profile.nnodes):  # every node's own command
            argv[node_key(state, profile, rank)] = forced_argv(profile, release, rank)
    both = {"input_ids": [11, 12, 13], "sampling_params": {"max_new_tokens": 4}}
    both |= dict.fromkeys(BOTH_PIN_FIELDS, 1)  # the pin for a release eagledata does not know
    return {
        "argv": argv,
        "bodies": {**bodies, "both pin fields": both},
        "vocab_size": VOCAB,
        "metrics": True,
        "kv_flags": True,
    }


@pytest.fixture(scope="module")
def reports(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    for release in RELEASES:  # build (or find) every folder first, one at a time
        sglangkit.release_folder(release)
    sglangkit.common()
    tmp = tmp_path_factory.mktemp("bodies")
    jobs = {
        r.version: build_job(r, captured_bodies(tokenizer_dir, tmp, r.version)) for r in RELEASES
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {r.version: pool.submit(sglangkit.probe, r, jobs[r.version]) for r in RELEASES}
        found = {version: future.result() for version, future in futures.items()}
    for version, report in found.items():
        report["job"] = jobs[version]
    return found


def claimed() -> list[tuple[Profile, Release]]:
    return [(p, r) for p in PROFILES for r in RELEASES if r.version in p.sglang_versions]


def unclaimed() -> list[tuple[Profile, Release]]:
    return [(p, r) for p in PROFILES for r in RELEASES if r.version not in p.sglang_versions]


def _id(pair: tuple[Profile, Release]) -> str:
    return f"{pair[0].name}@{pair[1].version}"


def _failed_steps(result: dict[str, Any]) -> list[str]:
    return [f"{s['name']}: {s['error']}" for s in result.get("steps", []) if s.get("ok") is False]


# --- the profiles ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", claimed(), ids=_id)
def test_every_profile_parses_and_resolves_on_every_release_it_claims(
    reports: dict[str, Any], pair: tuple[Profile, Release]
) -> None:
    profile, release = pair
    report = reports[release.version]
    assert report["release"] == release.version
    for rank in range(1, profile.nnodes):  # the other nodes' commands parse and resolve too
        node = report["argv"][node_key("claimed", profile, rank)]
        assert node["parse"]["ok"], f"sglang {release.version} node {rank}: {node['parse']}"
        assert _failed_steps(node) == [], f"node {rank}"
        assert node["server_info"]["node_rank"] == rank
        assert node["server_info"]["dist_init_addr"] == HEAD
    result = report["argv"][f"claimed:{profile.name}"]
    assert result["parse"]["ok"], f"sglang {release.version}: {result['parse']['error']}"
    for message in result["parse"]["warnings"]:
        if "deprecated" in message.lower():
            warnings.warn(SGLangDeprecation(f"{_id(pair)}: {message}"), stacklevel=1)
    assert _failed_steps(result) == []
    assert result["server_info"]["nnodes"] == profile.nnodes
    # the layout the release resolves, read back the way eagledata reads /server_info
    info = {**result["server_info"], "version": release.version}
    facts = ServerFacts.from_server_info(info)
    assert facts.dp_ranks == profile.dp_size
    assert facts.attention_dp == profile.enable_dp_attention
    assert (facts.dcp_size or 1) == profile.dcp_size
    assert facts.kv_cache_dtype == profile.kv_cache_dtype
    assert facts.speculative_algorithm == profile.speculative_algorithm
    if facts.speculative is not None:
        assert (
            facts.speculative.num_draft_tokens
            == profile.sglang_args["speculative-num-draft-tokens"]
        )
    assert facts.release_known and facts.rank_pin_fields == (release.server.rank_pin,)


@pytest.mark.parametrize("pair", unclaimed(), ids=_id)
def test_a_release_refuses_what_its_file_says_it_cannot_run(
    reports: dict[str, Any], pair: tuple[Profile, Release]
) -> None:
    profile, release = pair
    result = reports[release.version]["argv"][f"forced:{profile.name}"]
    reasons = unsupported(profile.sglang_args, release)
    assert reasons, f"{profile.name} does not claim {release.version}, yet nothing refuses it"
    for reason in reasons:
        if reason.startswith("no --"):
            flag = reason.split(":", 1)[0].removeprefix("no ")
            assert not result["parse"]["ok"], f"sglang {release.version} took {flag}"
            assert flag in result["parse"]["error"]
        elif reason.startswith("refuses kimi-k25-eagle3"):
            assert not _has_eagle3_hooks(release)
        elif reason.startswith("refuses speculative-with-dcp"):
            assert result["parse"]["ok"]
            assert any("speculative" in step for step in _failed_steps(result))
        else:
            raise AssertionError(f"no check for {reason!r}")


def _has_eagle3_hooks(release: Release) -> bool:
    """Does the release's Kimi-K2.5 class forward the hooks the EAGLE-3 worker calls?"""
    source = sglangkit.release_folder(release) / "sglang" / "srt" / "models" / "kimi_k25.py"
    text = source.read_text()
    return "def set_eagle3_layers_to_capture" in text and "def get_embed_and_head" in text


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_the_releases_that_run_kimi_eagle3_have_its_hooks(release: Release) -> None:
    refuses = "kimi-k25-eagle3" in release.refuses
    assert _has_eagle3_hooks(release) != refuses


def _length_checked_first(release: Release) -> bool:
    """In the release's own ``Req`` finish check, does the ``max_new_tokens`` test come before
    the stop-token test?"""
    source = sglangkit.release_folder(release) / "sglang" / "srt" / "managers"
    text = (source / "schedule_batch.py").read_text()
    name = (
        "def update_finish_state(" if "def update_finish_state(" in text else "def check_finished("
    )
    body = text[text.index(name) :]
    body = body[: body.index("\n    def ", 1)]
    length = body.index("len(self.output_ids) >= self.sampling_params.max_new_tokens")
    stop = body.index("self._check_token_based_finish(")
    return length < stop


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_the_release_file_says_how_a_stop_at_the_length_limit_is_reported(
    release: Release,
) -> None:
    """An answer whose stop token is its max_new_tokens-th id: ``length`` where the release
    checks the length first (server/responses.py reads it as stopped either way)."""
    expected = "length" if _length_checked_first(release) else "stop"
    assert release.server.finish_at_limit == expected


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_the_release_file_spells_flags_as_the_release_does(
    reports: dict[str, Any], release: Release
) -> None:
    options = set(reports[release.version]["kv_flags"]["options"])
    for flag in release.flags.missing:
        assert f"--{flag}" not in options, f"sglang {release.version} has --{flag}"
    for new in release.flags.renamed.values():
        assert f"--{new}" in options
    dp_attention = {
        "attn-dp-size": "--attn-dp-size",
        "enable-dp-attention": "--enable-dp-attention",
    }
    assert dp_attention[release.flags.dp_attention] in options


# --- what eagledata sends and reads -------------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_every_request_body_eagledata_sends_is_taken_whole(
    reports: dict[str, Any], release: Release
) -> None:
    report = reports[release.version]
    sent = report["job"]["bodies"]
    kinds = {name for name in sent if name != "both pin fields"}
    assert any("rid" in name for name in kinds) and any("logprob" in name for name in kinds)
    pin = release.server.rank_pin
    assert any(pin in name for name in kinds), "the run sent no pinned request"
    for name, result in report["bodies"].items():
        body = sent[name]
        if "contract" in result:  # 0.5.23's JSON contract runs first
            assert result["contract"] is None, f"{name}: {result['contract']}"
        assert result["ok"], f"{name}: {result.get('error')}"
        wanted = body.get(pin, body.get("routed_dp_rank", body.get("data_parallel_rank")))
        assert result["pinned_rank"] == wanted, name
        if name == "both pin fields":
            continue  # one of the two is dropped or aliased: that is the point
        assert result["ignored_keys"] == [], f"{name}: dropped silently"
        assert result["deprecations"] == [], name


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_every_metric_eagledata_reads_is_one_the_release_registers(
    reports: dict[str, Any], release: Release
) -> None:
    metrics = reports[release.version]["metrics"]
    assert all(c["ok"] for c in metrics["collectors"].values()), metrics["collectors"]
    missing = [name for name in METRIC_NAMES if name not in set(metrics["samples"])]
    assert missing == [], f"sglang {release.version} ({metrics['file']}) has no {missing}"


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
def test_every_way_to_ask_a_release_for_a_non_bf16_kv_cache_is_refused(
    reports: dict[str, Any], release: Release
) -> None:
    dests = reports[release.version]["kv_flags"]["dests"]
    assert "kv_cache_dtype" in dests
    assert ("speculative_draft_kv_cache_dtype" in dests) == (
        "speculative-draft-kv-cache-dtype" not in release.flags.missing
    )
    for dest in dests.values():
        spellings = [*dest["options"], *dest["shortest_prefix"].values()]
        assert "bf16" in dest["choices"]
        for spelling in spellings:
            base = [] if spelling.startswith("--kv") else ["--kv-cache-dtype", "bf16"]
            check_server_args([*base, spelling, "bf16"])
            for choice in dest["choices"]:
                if choice in ("bf16", "bfloat16"):
                    continue
                with pytest.raises(LaunchError):
                    check_server_args([*base, spelling, choice])
                with pytest.raises(LaunchError):
                    check_server_args([*base, f"{spelling}={choice}"])


# --- the matrix in the docs ---------------------------------------------------------------------


def _cell(profile: Profile, release: Release, report: dict[str, Any]) -> str:
    if release.version in profile.sglang_versions:
        info = report["argv"][f"claimed:{profile.name}"]["server_info"]
        layout = []
        if profile.enable_dp_attention:
            keys = ("dp_size", "attn_dp_size") if "attn_dp_size" in info else ("dp_size",)
            layout.append(", ".join(f"{k} {info[k]}" for k in keys))
        if profile.dcp_size > 1:
            layout.append(f"dcp_size {info['dcp_size']}")
        if profile.nnodes > 1:
            layout.append(f"nnodes {info['nnodes']}: node_rank 0-{profile.nnodes - 1} each parsed")
        return "parsed" + (f" ({'; '.join(layout)})" if layout else "")
    result = report["argv"][f"forced:{profile.name}"]
    reason = unsupported(profile.sglang_args, release)[0]
    if reason.startswith("no --"):
        return f"refused: argparse `{_short(result['parse']['error'])}`"
    if reason.startswith("refuses kimi-k25-eagle3"):
        return "refused: `models/kimi_k25.py` lacks the EAGLE-3 hooks"
    step = next(s for s in result["steps"] if s.get("ok") is False)
    return f"refused by `{step['name']}`: {_short(step['error'])}"


def _short(text: str) -> str:
    """The gist of a release's message: no location, no parentheses, up to a ', but'."""
    text = re.sub(r" \(at [^)]*\)$", "", text)
    text = re.sub(r"^\w+Error: ", "", text)
    text = re.sub(r" \([^)]*\)", "", text).split(", but ")[0].replace("|", "/")
    return text if len(text) <= 90 else text[:87].rstrip() + "..."


def matrix(reports: dict[str, Any]) -> str:
    head = "| profile | " + " | ".join(r.version for r in RELEASES) + " |"
    lines = [head, "|---" * (len(RELEASES) + 1) + "|"]
    for profile in PROFILES:
        cells = [_cell(profile, r, reports[r.version]) for r in RELEASES]
        lines.append(f"| `{profile.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_matrix_in_the_docs_is_the_one_the_releases_give(reports: dict[str, Any]) -> None:
    text = MATRIX_DOC.read_text()
    start, end = "<!-- matrix: tests/test_sglang_releases.py -->", "<!-- end matrix -->"
    assert start in text and end in text, f"{MATRIX_DOC} lost its matrix markers"
    shipped = text.split(start, 1)[1].split(end, 1)[0].strip()
    expected = matrix(reports)
    assert shipped == expected, f"docs/sglang.md's matrix is stale; the releases say:\n{expected}"
