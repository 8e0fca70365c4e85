"""launch-server: the exact command, every way to ask for a non-bf16 KV cache refused, launch."""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import stat
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from eagledata.errors import ConfigError, LaunchError
from eagledata.profiles.loading import list_profiles, load_profile, parse_profile
from eagledata.profiles.profile import Profile
from eagledata.server.launch import (
    build_launch_command,
    format_command,
    group_members,
    launch_and_wait,
    start_process,
    stop_process,
)
from eagledata.server.launch_args import check_server_args, model_from_argv
from eagledata.server.launch_release import choose_version, installed_sglang_version
from eagledata.server.readiness import wait_for_health

REPO = Path(__file__).resolve().parents[1]
PROFILES_DIR = REPO / "configs" / "profiles"
SCRIPT = REPO / "scripts" / "launch_sglang.sh"
LAUNCHABLE = ["kimi-k25-reference-bf16", "kimi-k25-tp8", "kimi-k25-dpa4", "kimi-k25-dcp8"]


def profile(name: str) -> Profile:
    return load_profile(name, PROFILES_DIR)


def build(
    chosen: Profile,
    extra: list[str] | tuple[str, ...] = (),
    *,
    version: str | None = None,
    **options: Any,
) -> list[str]:
    """The launch command of ``chosen`` on ``version`` (default: the newest it runs on)."""
    return build_launch_command(chosen, extra, version=version or chosen.newest_version, **options)


def profile_data(name: str) -> dict[str, Any]:
    with (PROFILES_DIR / f"{name}.toml").open("rb") as handle:
        return tomllib.load(handle)


# --- the command ----------------------------------------------------------------------------


def test_shipped_profiles() -> None:
    names = list_profiles(PROFILES_DIR)
    assert set(LAUNCHABLE) | {"kimi-k25-fp8-rejected"} <= set(names)


def test_dry_run_command_of_the_tuned_tp8_profile() -> None:
    command = build(profile("kimi-k25-tp8"), version="0.5.9")
    assert command == [
        "scripts/launch_sglang.sh",
        "--model-path", "moonshotai/Kimi-K2.5",
        "--trust-remote-code",
        "--tp-size", "8",
        "--kv-cache-dtype", "bf16",
        "--mem-fraction-static", "0.9",
        "--context-length", "32768",
        "--max-running-requests", "88",
        "--cuda-graph-max-bs", "96",
        "--chunked-prefill-size", "4096",
        "--enable-metrics",
        "--max-queued-requests", "32",
        "--host", "127.0.0.1",
        "--port", "30000",
    ]  # fmt: skip
    assert format_command(command) == (
        "scripts/launch_sglang.sh --model-path moonshotai/Kimi-K2.5 --trust-remote-code "
        "--tp-size 8 --kv-cache-dtype bf16 --mem-fraction-static 0.9 --context-length 32768 "
        "--max-running-requests 88 --cuda-graph-max-bs 96 --chunked-prefill-size 4096 "
        "--enable-metrics --max-queued-requests 32 --host 127.0.0.1 --port 30000"
    )


@pytest.mark.parametrize("name", LAUNCHABLE)
def test_dry_run_command_of_every_launchable_profile(name: str) -> None:
    command = build(profile(name), script="scripts/launch_sglang.sh")
    assert command[0] == "scripts/launch_sglang.sh"
    assert command.count("--kv-cache-dtype") == 1
    assert command[command.index("--kv-cache-dtype") + 1] == "bf16"
    assert command[-4:] == ["--host", "127.0.0.1", "--port", "30000"]
    assert shlex.split(format_command(command)) == command
    assert model_from_argv(command) == "moonshotai/Kimi-K2.5"


def test_dcp_and_dpa_profiles_emit_their_parallelism() -> None:
    dcp = build(profile("kimi-k25-dcp8"))
    assert dcp[dcp.index("--dcp-size") + 1] == "8"
    assert "--cuda-graph-max-bs-decode" in dcp  # 0.5.15 renamed the flag
    dpa = build(profile("kimi-k25-dpa4"), version="0.5.9")
    assert "--enable-dp-attention" in dpa and dpa[dpa.index("--dp-size") + 1] == "4"


def test_each_release_gets_its_own_spelling() -> None:
    """One profile, three forms: 0.5.9 has only --cuda-graph-max-bs; 0.5.15.post1 deprecates
    it for --cuda-graph-max-bs-decode; 0.5.23 drops it and spells DP attention
    --attn-dp-size (configs/sglang-releases/)."""
    dpa4 = profile("kimi-k25-dpa4")
    forms = {v: build(dpa4, version=v) for v in ("0.5.9", "0.5.15.post1", "0.5.23")}
    assert forms["0.5.9"][forms["0.5.9"].index("--cuda-graph-max-bs") + 1] == "48"
    assert "--cuda-graph-max-bs" not in forms["0.5.15.post1"] + forms["0.5.23"]
    for version in ("0.5.15.post1", "0.5.23"):
        form = forms[version]
        assert form[form.index("--cuda-graph-max-bs-decode") + 1] == "48"
    for version in ("0.5.9", "0.5.15.post1"):
        form = forms[version]
        assert "--enable-dp-attention" in form and form[form.index("--dp-size") + 1] == "4"
        assert "--attn-dp-size" not in form
    new = forms["0.5.23"]
    assert new[new.index("--attn-dp-size") + 1] == "4"
    assert "--dp-size" not in new and "--enable-dp-attention" not in new
    # everything else the same, in the same order
    assert new.index("--attn-dp-size") == forms["0.5.9"].index("--dp-size")
    assert len(forms["0.5.9"]) == len(new) + 1


@pytest.mark.parametrize(
    ("name", "version", "why"),
    [
        ("kimi-k25-dcp8", "0.5.9", "no --dcp-size"),
        ("kimi-k25-tp8-eagle3", "0.5.9", "refuses kimi-k25-eagle3"),
        ("kimi-k25-dcp8-eagle3", "0.5.15.post1", "refuses speculative-with-dcp"),
        ("kimi-k25-tp8", "0.5.99", "not a release eagledata knows"),
    ],
)
def test_a_release_without_a_form_is_one_line_naming_those_with_one(
    name: str, version: str, why: str
) -> None:
    chosen = profile(name)
    with pytest.raises(ConfigError) as caught:
        build(chosen, version=version)
    message = str(caught.value)
    assert "\n" not in message and why in message
    assert message.startswith(f"profile {name} has no form for sglang {version} (")
    assert message.endswith(f"; it runs on {', '.join(chosen.sglang_versions)}")


def test_extra_arguments_come_last_and_are_quoted() -> None:
    command = build(
        profile("kimi-k25-tp8"),
        ["--mem-fraction-static", "0.88", "--served-model-name", "kimi k2.5"],
    )
    assert command[-4:] == ["--mem-fraction-static", "0.88", "--served-model-name", "kimi k2.5"]
    assert format_command(command).endswith("--served-model-name 'kimi k2.5'")


def sglang_reads(command: list[str]) -> str:
    """The ``--kv-cache-dtype`` argparse ends with: the last one given. (SGLang's own parser reads
    every profile of every release it claims in tests/test_sglang_releases.py.)"""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--kv-cache-dtype")
    known, _ = parser.parse_known_args(command[1:])
    return str(known.kv_cache_dtype)


@pytest.mark.parametrize(
    ("extra", "dtype"),
    [(["--kv-cache-dtype", "bfloat16"], "bfloat16"), (["--kv-cache-dtype=bf16"], "bf16")],
)
def test_bf16_overrides_are_accepted(extra: list[str], dtype: str) -> None:
    base = build(profile("kimi-k25-tp8"))
    command = build(profile("kimi-k25-tp8"), extra)
    assert command == [*base, *extra]  # the override reaches the command as given, last
    assert sglang_reads(command) == dtype  # and SGLang ends with it: bf16 either way


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "flag_and_value"),
    [
        (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3"),
        (["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype fp8_e5m2"),
        (["--kv-cache-dtype", "fp4_e2m1"], "--kv-cache-dtype fp4_e2m1"),
        (["--kv-cache-dtype", "mxfp8"], "--kv-cache-dtype mxfp8"),
        (["--kv-cache-dtype", "nvfp4"], "--kv-cache-dtype nvfp4"),
        (["--kv-cache-dtype=fp8_e5m2"], "--kv-cache-dtype fp8_e5m2"),
        (["--kv-cache", "fp8_e4m3"], "--kv-cache fp8_e4m3"),  # argparse abbreviation
        (["--kv-cache-dtype", "BF16"], "--kv-cache-dtype BF16"),  # not a valid choice
    ],
)
def test_non_bf16_kv_overrides_are_refused(extra: list[str], flag_and_value: str) -> None:
    with pytest.raises(LaunchError) as caught:
        build(profile("kimi-k25-tp8"), extra)
    message = str(caught.value)
    assert message.startswith(f"refused {flag_and_value}: ")
    assert "fp8 KV cache degraded Kimi-K2.5" in message
    assert "poisons the drafter's training data" in message
    assert "Fix: drop the override" in message
    assert "\n" not in message


def test_auto_is_refused_with_its_own_reason() -> None:
    with pytest.raises(LaunchError) as caught:
        build(profile("kimi-k25-tp8"), ["--kv-cache-dtype", "auto"])
    assert str(caught.value).startswith(
        "refused --kv-cache-dtype auto: SGLang silently resolves 'auto' to fp8"
    )


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        (["--quantization-param-path", "kv_scales.json"], "refused --quantization-param-path:"),
        (["--quantization-param=kv.json"], "refused --quantization-param:"),
        (["--config", "server.yaml"], "refused --config:"),
        (["--config=server.yaml"], "refused --config:"),
        (["--kv-cache-dtype"], "refused --kv-cache-dtype: it needs a value"),
    ],
)
def test_kv_quantizing_or_hiding_flags_are_refused(extra: list[str], start: str) -> None:
    with pytest.raises(LaunchError) as caught:
        build(profile("kimi-k25-tp8"), extra)
    assert str(caught.value).startswith(start)
    assert "Fix:" in str(caught.value)


def test_weight_quantization_is_not_kv_quantization() -> None:
    extra = ["--quantization", "compressed-tensors"]
    command = build(profile("kimi-k25-tp8"), extra)
    assert command[-2:] == extra  # the weights' quantization reaches the command...
    assert sglang_reads(command) == "bf16"  # ...and the KV cache stays bf16


def test_argv_without_a_kv_dtype_is_refused() -> None:
    with pytest.raises(LaunchError, match="no --kv-cache-dtype given"):
        check_server_args(["--model-path", "m"])


def test_plan_only_profile_is_refused() -> None:
    rejected = profile("kimi-k25-fp8-rejected")
    assert rejected.plan_only
    with pytest.raises(LaunchError) as caught:
        build(rejected)
    message = str(caught.value)
    assert message.startswith("refused profile 'kimi-k25-fp8-rejected': it is plan_only")
    assert "kv-cache-dtype fp8_e4m3" in message and "Fix: launch a bf16 profile" in message


# --- profile validation ---------------------------------------------------------------------


def test_launchable_profile_with_fp8_is_a_config_error() -> None:
    data = profile_data("kimi-k25-tp8")
    data["sglang_args"]["kv-cache-dtype"] = "fp8_e4m3"
    with pytest.raises(ConfigError) as caught:
        parse_profile(data, name="bad", source="bad.toml")
    assert "bad.toml: sglang_args.kv-cache-dtype is 'fp8_e4m3'" in str(caught.value)


@pytest.mark.parametrize(
    ("mutate", "line"),
    [
        (lambda d: d.update(colour="blue"), "bad.toml: colour: Extra inputs are not permitted"),
        (
            lambda d: d["model"].update(pre_free="94"),
            "bad.toml: model.pre_free: Extra inputs are not permitted",
        ),
        (
            lambda d: d["sglang_args"].update({"tp": 8}),
            "bad.toml: sglang_args: 'tp': write 'tp-size'",
        ),
        (
            lambda d: d["sglang_args"].update({"port": 1}),
            "bad.toml: sglang_args: 'port' is not allowed: set [server] port instead",
        ),
        (
            lambda d: d["sglang_args"].update({"quantization-param-path": "s.json"}),
            "bad.toml: sglang_args: 'quantization-param-path' is not allowed",
        ),
        (
            lambda d: d["sglang_args"].update({"--tp-size": 8}),
            "bad.toml: sglang_args: '--tp-size' is not a flag name",
        ),
        (
            lambda d: d["sglang_args"].pop("kv-cache-dtype"),
            "bad.toml: sglang_args: 'kv-cache-dtype' is required",
        ),
        (
            lambda d: d["sglang_args"].update({"enable-metrics": False}),
            "bad.toml: sglang_args: 'enable-metrics' = false: delete the key",
        ),
        (
            lambda d: d["sglang_args"].update({"mem-fraction-static": 1.2}),
            "bad.toml: sglang_args.mem-fraction-static: must be a number in (0, 1)",
        ),
        (
            lambda d: d["sglang_args"].update({"dp-size": 3, "enable-dp-attention": True}),
            "bad.toml: sglang_args.dp-size: DP attention needs dp-size > 1 dividing tp-size 8",
        ),
        (lambda d: d["server"].update(port=0), "bad.toml: server.port: Input should be greater"),
    ],
)
def test_profile_errors_name_the_key(mutate: Any, line: str) -> None:
    data = profile_data("kimi-k25-tp8")
    mutate(data)
    with pytest.raises(ConfigError) as caught:
        parse_profile(data, name="bad", source="bad.toml")
    assert any(got.startswith(line) for got in str(caught.value).splitlines()), str(caught.value)


def test_unknown_profile_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        load_profile("kimi-k25-nope", PROFILES_DIR)
    assert "unknown profile 'kimi-k25-nope'" in str(caught.value)
    assert "kimi-k25-tp8" in str(caught.value)


def test_profile_by_path_and_bad_toml(tmp_path: Path) -> None:
    assert load_profile(PROFILES_DIR / "kimi-k25-tp8.toml").name == "kimi-k25-tp8"
    broken = tmp_path / "broken.toml"
    broken.write_text("sglang_args = [\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_profile(broken)


def test_wildcard_host_is_polled_on_loopback() -> None:
    data = profile_data("kimi-k25-tp8")
    data["server"] = {"host": "0.0.0.0", "port": 31000}
    assert parse_profile(data, name="x").server.base_url == "http://127.0.0.1:31000"


# --- the shell script, second line of defence ----------------------------------------------


@pytest.fixture
def recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """A fake SGLANG_PYTHON that records its argv instead of starting SGLang."""
    record = tmp_path / "argv.txt"
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake, record


def run_script(fake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLANG_PYTHON": str(fake)}
    return subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_script_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)


def test_script_execs_sglang_with_the_arguments_unchanged(
    recording_python: tuple[Path, Path],
) -> None:
    fake, record = recording_python
    args = build(profile("kimi-k25-tp8"), ["--served-model-name", "a b; rm -rf /"])[1:]
    result = run_script(fake, *args)
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == ["-m", "sglang.launch_server", *args]


@pytest.mark.parametrize(
    "args",
    [
        ["--kv-cache-dtype", "fp8_e4m3"],
        ["--kv-cache-dtype=fp8_e5m2"],
        ["--kv-cache-dtype", "auto"],
        ["--kv-cache-dtype", "fp4_e2m1"],
        ["--kv-cache", "fp8_e4m3"],
        ["--kv-cache-dtype", "bf16", "--kv-cache-dtype", "fp8_e4m3"],
        ["--model-path", "m"],
        ["--kv-cache-dtype"],
        ["--kv-cache-dtype", "bf16", "--quantization-param-path", "s.json"],
        ["--kv-cache-dtype", "bf16", "--config", "c.yaml"],
        ["--kv-cache-dtype", "bf16", "--speculative-draft-kv-cache-dtype", "fp8_e4m3"],
        ["--kv-cache-dtype", "bf16", "--speculative-draft-kv-cache-dtype=auto"],
        ["--kv-cache-dtype", "bf16", "--speculative-draft-k", "fp8_e5m2"],
        ["--speculative-draft-kv-cache-dtype", "bf16"],  # the draft's is not the target's
    ],
)
def test_script_refuses_non_bf16(recording_python: tuple[Path, Path], args: list[str]) -> None:
    fake, record = recording_python
    result = run_script(fake, "--model-path", "moonshotai/Kimi-K2.5", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("launch_sglang.sh: refused: ")
    assert not record.exists(), "sglang must never start"


def test_script_refusal_message_names_the_reason(recording_python: tuple[Path, Path]) -> None:
    fake, _ = recording_python
    result = run_script(fake, "--kv-cache-dtype", "fp8_e4m3")
    assert result.stderr.strip() == (
        "launch_sglang.sh: refused: --kv-cache-dtype fp8_e4m3: only a bf16 KV cache is allowed "
        "(fp8 degraded Kimi-K2.5 and poisons drafter data); pass --kv-cache-dtype bf16"
    )


# --- launch and wait ------------------------------------------------------------------------

FAKE_SGLANG = textwrap.dedent(
    '''
    """Stands in for `python -m sglang.launch_server`: /health 503 then 200, /server_info."""
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = sys.argv[1:]
    assert argv[:2] == ["-m", "sglang.launch_server"], argv
    def arg(name, default=None):
        return argv[argv.index(name) + 1] if name in argv else default
    if os.environ.get("FAKE_EXIT"):
        sys.exit(int(os.environ["FAKE_EXIT"]))
    requested = arg("--kv-cache-dtype")
    internal = os.environ.get("FAKE_INTERNAL_KV", requested)
    tokens = 188000
    cell = 70272 if internal in ("bf16", "bfloat16") else 35136
    info = {
        "model_path": arg("--model-path"), "kv_cache_dtype": requested, "tp_size": 8,
        "dp_size": 1, "enable_dp_attention": False, "mem_fraction_static": 0.9,
        "max_total_num_tokens": tokens, "max_req_input_len": 32763, "context_length": 32768,
        "version": "0.5.9", "internal_states": [{"kv_cache_dtype": internal,
        "memory_usage": {"kvcache": round(tokens * cell / 2**30, 2), "token_capacity": tokens}}],
    }
    state = {"health": int(os.environ.get("FAKE_HEALTH_503", "2"))}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            if self.path == "/health":
                if state["health"] > 0:
                    state["health"] -= 1
                    self.send_response(503); self.end_headers(); return
                self.send_response(200); self.end_headers(); return
            if self.path == "/server_info":
                body = json.dumps(info).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers(); self.wfile.write(body); return
            self.send_response(404); self.end_headers()

    ThreadingHTTPServer((arg("--host"), int(arg("--port"))), Handler).serve_forever()
    '''
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fake_sglang(tmp_path: Path) -> dict[str, str]:
    server = tmp_path / "fake_sglang.py"
    server.write_text(FAKE_SGLANG)
    python = tmp_path / "fake-python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{server}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "SGLANG_PYTHON": str(python)}


def tp8_on_free_port() -> Profile:
    data = profile_data("kimi-k25-tp8")
    data["server"]["port"] = free_port()
    return parse_profile(data, name="kimi-k25-tp8", source=str(PROFILES_DIR / "kimi-k25-tp8.toml"))


def test_launch_waits_for_health_and_passes_the_guard(fake_sglang: dict[str, str]) -> None:
    progress: list[str] = []
    result = launch_and_wait(
        tp8_on_free_port(),
        version="0.5.9",
        script=SCRIPT,
        env=fake_sglang,
        deadline_s=30,
        poll_interval_s=0.05,
        on_progress=progress.append,
    )
    try:
        assert result.verdict.ok, result.verdict.problems
        assert result.facts.max_total_num_tokens == 188_000
        assert result.process.poll() is None
        assert progress[0].startswith("starting: ")
        assert any("HTTP 503" in line or "not listening" in line for line in progress)
        assert progress[-1].startswith("bf16 KV ok")
    finally:
        result.stop(timeout_s=5)
    assert result.process.poll() is not None


def test_launch_stops_a_server_the_guard_refuses(fake_sglang: dict[str, str]) -> None:
    env = {**fake_sglang, "FAKE_INTERNAL_KV": "fp8_e4m3"}
    result = launch_and_wait(
        tp8_on_free_port(),
        version="0.5.9",
        script=SCRIPT,
        env=env,
        deadline_s=30,
        poll_interval_s=0.05,
    )
    assert not result.verdict.ok
    assert result.verdict.problems[0] == "internal_states[0].kv_cache_dtype is 'fp8_e4m3', not bf16"
    assert result.process.poll() is not None  # stopped


def test_launch_reports_a_server_that_dies(fake_sglang: dict[str, str]) -> None:
    env = {**fake_sglang, "FAKE_EXIT": "3"}
    with pytest.raises(LaunchError, match="sglang exited with code 3 before"):
        launch_and_wait(
            tp8_on_free_port(),
            version="0.5.9",
            script=SCRIPT,
            env=env,
            deadline_s=30,
            poll_interval_s=0.05,
        )


def test_launch_with_a_missing_script() -> None:
    with pytest.raises(LaunchError, match=r"cannot start /nonexistent/launch_sglang\.sh"):
        launch_and_wait(
            tp8_on_free_port(),
            version="0.5.9",
            script="/nonexistent/launch_sglang.sh",
            deadline_s=1,
        )


def test_health_deadline() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(503))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    seen: list[str] = []
    with httpx.Client(transport=transport) as client, pytest.raises(LaunchError) as caught:
        wait_for_health(
            client,
            "http://server:30000",
            deadline_s=60,
            poll_interval_s=10,
            on_progress=seen.append,
            clock=lambda: now[0],
            sleep=sleep,
        )
    assert str(caught.value).startswith(
        "http://server:30000/health not ready after 60s (last: HTTP 503)"
    )
    assert seen[0] == "waiting for http://server:30000/health: HTTP 503 (0s)"
    assert len(seen) == 6


# --- which release is launched ---------------------------------------------------------------


def test_the_installed_release_is_read_from_the_launch_interpreter(tmp_path: Path) -> None:
    """``SGLANG_PYTHON``'s own metadata says which sglang it has (nothing is imported)."""
    site = tmp_path / "site"
    (site / "sglang-0.5.23.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.23.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"
    )
    python = tmp_path / "python-with-sglang"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    assert installed_sglang_version(str(python)) == "0.5.23"
    assert installed_sglang_version(sys.executable) is None  # the project's venv has none
    assert installed_sglang_version(str(tmp_path / "no-such-python")) is None


@pytest.mark.parametrize(
    ("requested", "installed", "dry_run", "expected"),
    [
        (None, "0.5.15.post1", False, ("0.5.15.post1", "sglang 0.5.15.post1 (installed for py)")),
        (None, None, True, ("0.5.23", "no sglang installed for py (SGLANG_PYTHON): the sglang "
                                      "0.5.23 form; --sglang-version V shows another")),
        ("0.5.9", "0.5.23", True, ("0.5.9", "sglang 0.5.9 form (sglang 0.5.23 is installed)")),
        ("0.5.23", "0.5.24", False, ("0.5.23", "sglang 0.5.23 form (sglang 0.5.24 is installed)")),
    ],
)  # fmt: skip
def test_the_release_rendered_is_the_one_asked_for_else_the_installed_one(
    requested: str | None, installed: str | None, dry_run: bool, expected: tuple[str, str]
) -> None:
    chosen = choose_version(
        profile("kimi-k25-dpa4"),
        requested=requested,
        installed=installed,
        python="py",
        dry_run=dry_run,
    )
    assert chosen == expected


def test_an_installed_release_the_profile_lacks_is_one_line_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        choose_version(
            profile("kimi-k25-dcp8"), requested=None, installed="0.5.9", python="py", dry_run=False
        )
    message = str(caught.value)
    assert message.startswith("profile kimi-k25-dcp8 has no form for sglang 0.5.9 (no --dcp-size")
    assert message.endswith(
        "(sglang 0.5.9 is installed for py). Fix: install one of those, or pass "
        "--sglang-version V to launch V's form anyway"
    )
    with pytest.raises(LaunchError, match="no sglang installed for py"):
        choose_version(
            profile("kimi-k25-dcp8"), requested=None, installed=None, python="py", dry_run=False
        )


LINGERING_CHILD = """
import signal, subprocess, sys, time
# the child: on SIGTERM it takes a moment to let go (a scheduler freeing GPU memory, a router
# closing its port), then ends
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), sys.exit(0)))\\n"
    "print('ready', flush=True)\\n"
    "time.sleep(600)"], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)  # the leader: SIGTERM ends it at once
"""


def test_stopping_a_server_waits_for_its_whole_process_group() -> None:
    """SGLang's scheduler and detokenizer processes: children that may outlive the process we
    started by a moment, holding the GPU memory the next start needs. Stopping returns only
    once the whole group is gone."""
    process = start_process([sys.executable, "-c", LINGERING_CHILD], stdout=subprocess.PIPE)
    assert process.stdout is not None
    child = int(process.stdout.readline())
    assert child in group_members(process.pid)
    stop_process(process, timeout_s=30)
    assert group_members(process.pid) == []  # the child too, not only the leader


def test_a_stop_signal_while_ready_is_printed_still_stops_the_server() -> None:
    """SIGTERM sent as soon as "ready" is read (a SLURM script, a test) can land while
    launch-server is still printing: it must stop what it started all the same, not exit and
    leave the server or router running in its own process group."""
    import typer

    from eagledata.cli.launch_commands import serve_until_stopped

    process = start_process([sys.executable, "-c", "import time; time.sleep(600)"])

    def announce() -> None:
        raise KeyboardInterrupt  # what SIGTERM becomes in launch-server

    with pytest.raises(typer.Exit) as stopped:
        serve_until_stopped(process, lambda: stop_process(process), announce)
    assert stopped.value.exit_code == 130
    assert process.poll() is not None and group_members(process.pid) == []
