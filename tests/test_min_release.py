"""A profile names the oldest SGLang release it runs on (``min_release``) and runs on every
supported release from it on: the list of releases is ``configs/sglang-releases/``, kept once,
and a profile that needs a newer release says which, as the fix."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from eagledata.errors import ConfigError
from eagledata.profiles.loading import list_profiles, load_profiles, parse_profile
from eagledata.profiles.releases import oldest_form, releases, releases_from

PROFILES_DIR = Path(__file__).resolve().parent.parent / "configs" / "profiles"


def _data(name: str) -> dict[str, Any]:
    with (PROFILES_DIR / f"{name}.toml").open("rb") as handle:
        return tomllib.load(handle)


def test_releases_are_ordered_as_versions_not_as_text() -> None:
    """``"0.5.15.post1" < "0.5.9"`` as text: a text comparison would drop it from 0.5.9's."""
    assert [r.version for r in releases_from("0.5.9")] == ["0.5.9", "0.5.15.post1", "0.5.23"]
    assert [r.version for r in releases_from("0.5.15.post1")] == ["0.5.15.post1", "0.5.23"]
    assert [r.version for r in releases_from("0.5.15")] == ["0.5.15.post1", "0.5.23"]
    assert releases_from("0.6.0") == []


def test_no_profile_lists_its_releases_each_names_a_minimum() -> None:
    for name in list_profiles(PROFILES_DIR):
        data = _data(name)
        assert "sglang_versions" not in data and "min_release" in data, name
        profile = load_profiles([name], PROFILES_DIR)[0]
        assert profile.sglang_versions == [r.version for r in releases_from(data["min_release"])]
        assert profile.sglang_versions[-1] == releases()[-1].version


def test_a_minimum_older_than_the_flags_need_names_the_release_they_need() -> None:
    data = _data("kimi-k25-dcp8")  # --dcp-size first appears in 0.5.15
    data["min_release"] = "0.5.9"
    with pytest.raises(ConfigError) as caught:
        parse_profile(data, name="dcp8")
    message = str(caught.value)
    assert "\n" not in message
    assert "min_release: sglang 0.5.9: no --dcp-size" in message
    assert message.endswith(
        'these flags need SGLang >= 0.5.15.post1: set min_release = "0.5.15.post1"'
    )


def test_the_eagle3_dcp_profile_needs_the_release_that_allows_both() -> None:
    profile = load_profiles(["kimi-k25-dcp8-eagle3"], PROFILES_DIR)[0]
    needed = oldest_form(profile.sglang_args)
    assert needed is not None and needed.version == profile.min_release == "0.5.23"


def test_a_list_of_releases_is_refused_with_the_minimum_to_write() -> None:
    data = _data("kimi-k25-tp8-eagle3")
    del data["min_release"]
    data["sglang_versions"] = ["0.5.23", "0.5.15.post1"]
    with pytest.raises(ConfigError) as caught:
        parse_profile(data, name="listed")
    assert "sglang_versions: now min_release" in str(caught.value)
    assert 'write min_release = "0.5.15.post1"' in str(caught.value)


def test_a_minimum_eagledata_does_not_support_is_refused_naming_those_it_does() -> None:
    data = _data("kimi-k25-tp8")
    data["min_release"] = "0.5.10"
    with pytest.raises(
        ConfigError, match=re.escape("'0.5.10' is not a release eagledata supports")
    ):
        parse_profile(data, name="odd")


def test_a_release_below_the_minimum_is_refused_naming_the_minimum() -> None:
    profile = load_profiles(["kimi-k25-tp8-eagle3"], PROFILES_DIR)[0]
    with pytest.raises(ConfigError) as caught:
        profile.release("0.5.9")
    assert "it needs SGLang >= 0.5.15.post1" in str(caught.value)
