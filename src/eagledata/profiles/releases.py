"""The SGLang releases eagledata supports: one data file each, in ``configs/sglang-releases/``.

A release file says where that release differs from the others at the places eagledata meets
it (``docs/sglang.md``, "Adding a release"):

* ``[flags]``: how launch flags are spelt there (``renamed``: a flag spelt otherwise elsewhere ->
  its spelling here; ``dp_attention``: ``--dp-size N --enable-dp-attention`` or
  ``--attn-dp-size N``) and which flags it lacks (``missing``);
* ``[refuses]``: what it refuses although every flag parses (a closed list of conditions,
  :data:`CONDITIONS`);
* ``[server]``: how its server reports what eagledata reads: the ``/generate`` field that pins a
  DP rank, whether DCP token capacity counts one rank's rows or every rank's share, ``/get_load``.

A profile renders its ``launch_server`` argv for one release (:func:`render_args`); the same
data tell the server facts how to read a server of that release (:func:`release_for`). Adding a
release is one file here and one run of ``tests/test_sglang_releases.py``, which proves every
claim with the release's own code.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Literal, TypeVar

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, ValidationError

from eagledata.config import format_validation_error, shipped_path
from eagledata.errors import ConfigError

RELEASES_DIR = "configs/sglang-releases"

RankPin = Literal["data_parallel_rank", "routed_dp_rank"]
DcpCapacity = Literal["none", "per-rank", "logical"]
"""How a release reports token capacity under DCP: ``none`` (no DCP), ``per-rank`` (one DCP
rank's rows; the server holds ``dcp_size`` times as many), ``logical`` (already every rank's
share together)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FlagRules(_Strict):
    renamed: dict[str, str] = {}
    dp_attention: Literal["enable-dp-attention", "attn-dp-size"] = "enable-dp-attention"
    missing: dict[str, str] = {}


class ServerFactsRules(_Strict):
    rank_pin: RankPin
    dcp_capacity: DcpCapacity
    get_load: bool
    finish_at_limit: Literal["length", "stop"] = "stop"
    """How an answer whose stop token is its ``max_new_tokens``-th id is reported: ``length``
    (the length is checked before the stop token: the stop id is the last output id) or
    ``stop`` (the stop token first)."""


class CheckRules(_Strict):
    pins: list[str] = []
    """Packages this release needs at versions of its own to import its code on a CPU machine
    (its transformers and what that pins), installed beside it by the tests that prove the
    file (``tests/sglangkit.py``)."""


class Release(_Strict):
    """One supported SGLang release (a file of ``configs/sglang-releases/``)."""

    version: str
    summary: str = ""
    flags: FlagRules = FlagRules()
    refuses: dict[str, str] = {}
    """Condition (:data:`CONDITIONS`) -> why this release refuses it."""
    server: ServerFactsRules
    check: CheckRules = CheckRules()

    @property
    def key(self) -> Version:
        return version_key(self.version)


NO_VERSION = Version("0.dev0")
"""Where text that is no version sorts: before every release."""


def version_key(version: str) -> Version:
    """Order of release strings (PEP 440, ``packaging``): ``0.5.9 < 0.5.15 < 0.5.15.post1 <
    0.5.23``; a pre-release (``0.5.24rc1``, ``.dev0``) sorts before its release. Text that is no
    version sorts first."""
    try:
        return Version(version)
    except InvalidVersion:
        return NO_VERSION


def _load_release(path: Path) -> Release:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read the release file: {error}") from None
    try:
        release = Release.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, f"{path}: ")) from None
    if release.version != path.stem:
        raise ConfigError(f"{path}: version {release.version!r} must match its file name")
    unknown = sorted(set(release.refuses) - set(CONDITIONS))
    if unknown:
        raise ConfigError(
            f"{path}: refuses: unknown condition {unknown[0]!r} (known: {', '.join(CONDITIONS)})"
        )
    return release


@cache
def releases() -> tuple[Release, ...]:
    """Every supported release, oldest first."""
    directory = shipped_path(RELEASES_DIR)
    if directory is None or not directory.is_dir():
        raise ConfigError(f"{RELEASES_DIR}: not found; the installation is incomplete")
    found = [_load_release(path) for path in sorted(directory.glob("*.toml"))]
    if not found:
        raise ConfigError(f"{directory}: no release files")
    return tuple(sorted(found, key=lambda r: r.key))


def release_names() -> list[str]:
    """The supported releases, oldest first, from the files' names alone (each file's version
    is its name, ``_load_release``): cheap enough for ``--help``."""
    directory = shipped_path(RELEASES_DIR)
    if directory is None or not directory.is_dir():
        return []
    return sorted((path.stem for path in directory.glob("*.toml")), key=version_key)


def supported_versions() -> list[str]:
    return [release.version for release in releases()]


def get_release(version: str) -> Release | None:
    """The release file of exactly ``version``; None when eagledata does not know it."""
    return next((r for r in releases() if r.version == version), None)


def releases_from(minimum: str) -> list[Release]:
    """Every supported release at or above ``minimum`` (PEP 440 order), oldest first: the
    releases of a profile whose ``min_release`` it is."""
    floor = version_key(minimum)
    return [release for release in releases() if release.key >= floor]


def oldest_form(args: Mapping[str, object]) -> Release | None:
    """The oldest release from which every supported release has a form of ``args``: the
    ``min_release`` those flags need. None when the newest has none."""
    oldest = None
    for release in reversed(releases()):
        if unsupported(args, release):
            break
        oldest = release
    return oldest


def release_for(version: str | None) -> tuple[Release, bool]:
    """How to read a server that says it runs ``version``: ``(release, known)``. An unknown
    version is read as the newest known release at or below it (the oldest, below them all),
    and ``known`` is False: callers say so, and skip what cannot hold (``serverfacts``,
    ``verdict``)."""
    known = get_release(version) if version else None
    if known is not None:
        return known, True
    key = version_key(version or "")
    older = [r for r in releases() if r.key <= key]
    return (older[-1] if older else releases()[0]), False


# --- what a release refuses ---------------------------------------------------------------


class ProfileArgs:
    """What the conditions read of a profile: its ``[sglang_args]``."""

    def __init__(self, args: Mapping[str, object]) -> None:
        self.args = args

    def number(self, key: str) -> int:
        value = self.args.get(key, 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    @property
    def speculative(self) -> bool:
        return self.args.get("speculative-algorithm") is not None

    @property
    def model(self) -> str:
        return str(self.args.get("model-path", "")).lower()


CONDITIONS: dict[str, Callable[[ProfileArgs], bool]] = {
    "speculative-with-dcp": lambda a: a.speculative and a.number("dcp-size") > 1,
    "kimi-k25-eagle3": lambda a: a.speculative and "kimi-k2.5" in a.model,
}
"""The conditions a release file may refuse, each a test on a profile's flags."""


# --- rendering ----------------------------------------------------------------------------


def unsupported(args: Mapping[str, object], release: Release) -> list[str]:
    """Why a profile's flags have no form in ``release`` (empty: they do)."""
    problems = []
    for key in args:
        spelt = release.flags.renamed.get(key, key)
        if spelt in release.flags.missing:
            problems.append(f"no --{spelt}: {release.flags.missing[spelt]}")
    view = ProfileArgs(args)
    for condition, why in release.refuses.items():
        if CONDITIONS[condition](view):
            problems.append(f"refuses {condition}: {why}")
    return problems


V = TypeVar("V")


def render_args(args: Mapping[str, V], release: Release) -> list[tuple[str, V]]:
    """``[sglang_args]`` as ``(flag, value)`` pairs in ``release``'s spelling, in file order."""
    dp_attention = args.get("enable-dp-attention") is True
    attn_dp = dp_attention and release.flags.dp_attention == "attn-dp-size"
    pairs: list[tuple[str, V]] = []
    for key, value in args.items():
        if attn_dp and key == "enable-dp-attention":
            continue  # said by --attn-dp-size
        if attn_dp and key == "dp-size":
            pairs.append(("attn-dp-size", value))
            continue
        pairs.append((release.flags.renamed.get(key, key), value))
    return pairs
