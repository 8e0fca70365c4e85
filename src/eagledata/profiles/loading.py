"""Finding and reading launch profiles: ``configs/profiles/`` in the working directory (else the
shipped ones), one TOML file per profile, each problem one ``ConfigError`` line."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eagledata.config import format_validation_error, shipped_path
from eagledata.errors import ConfigError
from eagledata.profiles.profile import Profile

DEFAULT_PROFILES_DIR = Path("configs/profiles")
DEFAULT_PROFILE = "kimi-k25-tp8"
"""The profile ``launch-server`` uses when none is named: plain TP8, tuned, bf16."""


def parse_profile(data: dict[str, Any], *, name: str, source: str = "") -> Profile:
    """Validate a profile's TOML table; problems become one ``ConfigError`` line each."""
    where = source or name
    for reserved in ("name", "source"):
        if reserved in data:
            raise ConfigError(f"{where}: {reserved}: set by the loader, remove it from the file")
    try:
        return Profile.model_validate({**data, "name": name, "source": source})
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, f"{where}: ")) from None


def default_profiles_dir() -> Path:
    """``./configs/profiles`` when the working directory has one, else the shipped profiles."""
    if DEFAULT_PROFILES_DIR.is_dir():
        return DEFAULT_PROFILES_DIR
    return shipped_path(DEFAULT_PROFILES_DIR.as_posix()) or DEFAULT_PROFILES_DIR


def list_profiles(profiles_dir: str | Path | None = None) -> list[str]:
    """Names of the profiles in ``profiles_dir`` (default ``default_profiles_dir()``), sorted."""
    directory = Path(profiles_dir) if profiles_dir is not None else default_profiles_dir()
    if not directory.is_dir():
        return []
    return sorted(path.stem for path in directory.glob("*.toml"))


def shared_prefix(names: Sequence[str]) -> str:
    """What every name starts with, up to its last ``-``: ``kimi-k25-`` for ``kimi-k25-tp8``
    and ``kimi-k25-dcp8``; the tables show the rest as each profile's label."""
    if len(names) < 2:
        return ""
    first, last = min(names), max(names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    common = first[:size]
    return common[: common.rfind("-") + 1] if "-" in common else ""


def load_profile(name_or_path: str | Path, profiles_dir: str | Path | None = None) -> Profile:
    """Load a profile by name from ``profiles_dir``, or from a ``.toml`` path."""
    directory = Path(profiles_dir) if profiles_dir is not None else default_profiles_dir()
    candidate = Path(name_or_path)
    path = candidate if candidate.suffix == ".toml" else directory / f"{name_or_path}.toml"
    if not path.is_file() and candidate.suffix != ".toml":
        # the label plan shows under "profiles kimi-k25-*" (tp8 for kimi-k25-tp8)
        path = directory / f"{shared_prefix(list_profiles(directory))}{name_or_path}.toml"
    if not path.is_file():
        available = ", ".join(list_profiles(directory)) or "none"
        raise ConfigError(
            f"profile: unknown profile {str(name_or_path)!r} in {directory} "
            f"(available: {available})"
        )
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    return parse_profile(data, name=path.stem, source=str(path))


def load_profiles(
    names: Sequence[str] | None = None, profiles_dir: str | Path | None = None
) -> list[Profile]:
    """The named profiles, or every profile in the directory when ``names`` is None."""
    wanted = list(names) if names is not None else list_profiles(profiles_dir)
    return [load_profile(name, profiles_dir) for name in wanted]
