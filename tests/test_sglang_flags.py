"""The SGLang version contract: every flag a profile emits exists in its pinned release."""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from eagledata.errors import LaunchError
from eagledata.profiles.profile import BF16_KV_DTYPES, load_profiles
from eagledata.server.launch import check_server_args
from eagledata.server.sglang_flags import (
    DCP_SGLANG_VERSION,
    PINNED_SGLANG_VERSION,
    FlagContract,
    contract_path,
    extract_contract,
    extract_flags,
    load_contract,
)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
PROFILES_DIR = REPO / "configs" / "profiles"
S9_KV_CHOICES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")


def contract(version: str) -> FlagContract:
    return load_contract(contract_path(DATA, version))


def shipped_versions() -> list[str]:
    return sorted(
        p.name.removeprefix("sglang-").removesuffix("-server_args.json")
        for p in DATA.glob("sglang-*-server_args.json")
    )


def test_pinned_contract_is_shipped() -> None:
    pinned = contract(PINNED_SGLANG_VERSION)
    assert pinned.sglang_version == "0.5.9"
    assert len(pinned.flags) > 300
    assert "sha256:" in pinned.source


def test_kv_cache_dtype_choices_of_the_pinned_releases() -> None:
    for version in (PINNED_SGLANG_VERSION, DCP_SGLANG_VERSION):
        spec = contract(version).resolve("--kv-cache-dtype")
        assert spec is not None
        assert spec.choices == S9_KV_CHOICES


def test_dcp_flag_exists_only_from_0_5_15() -> None:
    assert contract("0.5.9").resolve("--dcp-size") is None
    assert contract("0.5.9").resolve("--decode-context-parallel-size") is None
    spec = contract(DCP_SGLANG_VERSION).resolve("--dcp-size")
    assert spec is not None and spec.names == ("--dcp-size", "--decode-context-parallel-size")
    # and 0.5.9's nearest flag is something else: NSA prefill context parallelism
    assert contract("0.5.9").resolve("--attn-cp-size") is not None


def test_cuda_graph_max_bs_is_deprecated_in_0_5_15() -> None:
    assert contract("0.5.9").resolve("--cuda-graph-max-bs") is not None
    spec = contract(DCP_SGLANG_VERSION).resolve("--cuda-graph-max-bs")
    assert spec is not None and spec.deprecated_for == "--cuda-graph-max-bs-decode"


def test_argparse_prefix_rules() -> None:
    pinned = contract(PINNED_SGLANG_VERSION)
    tp = pinned.resolve("--tp")
    assert tp is not None and "--tp-size" in tp.names
    kv = pinned.resolve("--kv-cache")
    assert kv is not None and kv.dest == "kv_cache_dtype"
    assert pinned.resolve("--kv") is None  # ambiguous: --kv-cache-dtype, --kv-events-config


@pytest.mark.parametrize("profile", load_profiles(profiles_dir=PROFILES_DIR), ids=lambda p: p.name)
def test_every_profile_flag_exists_in_its_release(profile: object) -> None:
    from eagledata.profiles.profile import Profile

    assert isinstance(profile, Profile)
    assert profile.sglang_version in shipped_versions(), "ship the contract of this release"
    problems = contract(profile.sglang_version).check_argv(profile.server_argv())
    assert problems == []


def test_every_non_bf16_kv_choice_of_every_release_is_refused() -> None:
    for version in shipped_versions():
        spec = contract(version).resolve("--kv-cache-dtype")
        assert spec is not None and spec.choices is not None
        for choice in spec.choices:
            argv = ["--kv-cache-dtype", choice]
            if choice in BF16_KV_DTYPES:
                check_server_args(argv)
            else:
                with pytest.raises(LaunchError):
                    check_server_args(argv)


def test_every_kv_quantizing_flag_is_refused() -> None:
    # every flag of the releases whose name says it sets a KV dtype or loads KV scales
    for version in shipped_versions():
        for spec in contract(version).flags:
            name = spec.names[0]
            if name.endswith("kv-cache-dtype") and not name.startswith("--speculative"):
                with pytest.raises(LaunchError):
                    check_server_args(["--kv-cache-dtype", "bf16", name, "fp8_e4m3"])
            if name == "--quantization-param-path":
                with pytest.raises(LaunchError):
                    check_server_args(["--kv-cache-dtype", "bf16", name, "scales.json"])


def test_check_argv_reports_unknown_deprecated_and_bad_choices() -> None:
    pinned = contract(PINNED_SGLANG_VERSION)
    problems = pinned.check_argv(
        ["--dcp-size", "8", "--kv-cache-dtype", "fp16", "--enable-metrics=1", "--tp-size"]
    )
    assert problems == [
        "--dcp-size does not exist in sglang 0.5.9",
        "--kv-cache-dtype 'fp16' is not one of: auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1",
        "--enable-metrics takes no value",
        "--tp-size needs a value",
    ]
    dcp = contract(DCP_SGLANG_VERSION).check_argv(["--cuda-graph-max-bs", "96"])
    assert dcp == [
        "--cuda-graph-max-bs is deprecated in sglang 0.5.15.post1; use --cuda-graph-max-bs-decode"
    ]


# --- the extractor on small sources of both declaration styles ------------------------------

ADD_ARGUMENT_SOURCE = textwrap.dedent(
    """
    import argparse
    BACKENDS = ["a", "b"]
    MORE = BACKENDS
    class DeprecatedAction(argparse.Action):
        pass
    class ServerArgs:
        kv_cache_dtype: str = "auto"
        @staticmethod
        def add_cli_args(parser):
            parser.add_argument("--model-path", "--model", type=str, required=True)
            parser.add_argument("--kv-cache-dtype", choices=["auto", "bf16", "fp8_e4m3"])
            parser.add_argument("--backend", choices=MORE)
            parser.add_argument("--plus", choices=["x"] + BACKENDS)
            local_choices = ["p", "q"]
            parser.add_argument("--local", choices=local_choices)
            parser.add_argument("--dynamic", choices=list(Registry.keys()))
            parser.add_argument("--flag", action="store_true")
            parser.add_argument("--old", action=DeprecatedAction)
            parser.add_argument("--many", nargs="+")
            parser.add_argument("--toggle", action=argparse.BooleanOptionalAction)
    """
)

DATACLASS_SOURCE = textwrap.dedent(
    """
    from typing import Annotated, List, Literal, Optional
    from sglang.srt.arg_groups.arg_utils import A, Arg
    KV_CHOICES = ["auto", "bf16", "fp8_e4m3"]
    class ServerArgs:
        model_path: A[str, Arg(help="path", aliases=["--model"])]
        host: A[str, "The host."] = "127.0.0.1"
        tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
        kv_cache_dtype: A[str, Arg(help="kv", choices=KV_CHOICES)] = "auto"
        mode: A[Literal["x", "y"], "mode"] = "x"
        paths: A[Optional[List[str]], "paths"] = None
        trust_remote_code: A[bool, "trust"] = False
        hidden: A[int, Arg(no_cli=True)] = 0
        renamed_field: A[int, Arg(help="r", cli_name="--short")] = 0
        plain: int = 0
        @staticmethod
        def add_cli_args(parser):
            parser.add_argument(
                "--cuda-graph-max-bs", type=int, action=DeprecatedAliasStoreAction,
                new_flag="--cuda-graph-max-bs-decode",
            )
    """
)


def test_extract_add_argument_style() -> None:
    flags = {spec.names[0]: spec for spec in extract_flags(ADD_ARGUMENT_SOURCE)}
    assert flags["--model-path"].names == ("--model-path", "--model")
    assert flags["--kv-cache-dtype"].choices == ("auto", "bf16", "fp8_e4m3")
    assert flags["--backend"].choices == ("a", "b")
    assert flags["--plus"].choices == ("x", "a", "b")
    assert flags["--local"].choices == ("p", "q")
    assert flags["--dynamic"].choices is None and flags["--dynamic"].choices_dynamic
    assert not flags["--flag"].takes_value
    assert flags["--old"].deprecated_for == "(removed)" and not flags["--old"].takes_value
    assert flags["--many"].nargs == "+"
    assert flags["--toggle"].names == ("--toggle", "--no-toggle")


def test_extract_dataclass_style() -> None:
    flags = {spec.names[0]: spec for spec in extract_flags(DATACLASS_SOURCE)}
    assert set(flags) == {
        "--model-path",
        "--host",
        "--tp-size",
        "--kv-cache-dtype",
        "--mode",
        "--paths",
        "--trust-remote-code",
        "--short",
        "--cuda-graph-max-bs",
    }
    assert flags["--model-path"].names == ("--model-path", "--model")
    assert flags["--tp-size"].names == ("--tp-size", "--tensor-parallel-size")
    assert flags["--kv-cache-dtype"].choices == ("auto", "bf16", "fp8_e4m3")
    assert flags["--mode"].choices == ("x", "y")
    assert flags["--paths"].nargs == "+"
    assert not flags["--trust-remote-code"].takes_value
    assert flags["--short"].dest == "renamed_field"
    assert flags["--cuda-graph-max-bs"].deprecated_for == "--cuda-graph-max-bs-decode"
    assert flags["--cuda-graph-max-bs"].takes_value


def test_extract_needs_the_server_args_class() -> None:
    with pytest.raises(ValueError, match="no class ServerArgs"):
        extract_flags("x = 1\n")


def test_contract_json_round_trip() -> None:
    built = extract_contract(ADD_ARGUMENT_SOURCE, sglang_version="9.9.9", origin="test")
    again = FlagContract.from_json(json.loads(built.dumps()))
    assert again == built
    assert again.names == built.names


def _load_script() -> ModuleType:
    path = REPO / "scripts" / "extract_sglang_flags.py"
    spec = importlib.util.spec_from_file_location("extract_sglang_flags", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_extract_script_reads_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("sglang/srt/server_args.py", DATACLASS_SOURCE)
    script = _load_script()
    out = tmp_path / "out"
    assert script.main([str(wheel), "--out-dir", str(out), "--min-flags", "1"]) == 0
    written = load_contract(out / "sglang-9.9.9-server_args.json")
    assert written.sglang_version == "9.9.9"
    assert written.resolve("--kv-cache-dtype") is not None
    # a release whose flags live elsewhere must not produce a thin contract silently
    assert script.main([str(wheel), "--out-dir", str(out)]) == 1


@pytest.mark.skipif(
    not os.environ.get("SGLANG_WHEEL_DIR"),
    reason="set SGLANG_WHEEL_DIR to a directory with the pinned sglang wheels to re-extract",
)
def test_shipped_contracts_match_the_wheels(tmp_path: Path) -> None:
    script = _load_script()
    wheel_dir = Path(os.environ["SGLANG_WHEEL_DIR"])
    for version in shipped_versions():
        wheel = next(wheel_dir.rglob(f"sglang-{version}-*.whl"))
        assert script.main([str(wheel), "--out-dir", str(tmp_path)]) == 0
        fresh = (tmp_path / f"sglang-{version}-server_args.json").read_text()
        assert fresh == contract_path(DATA, version).read_text()
