"""Where settings come from: the TOML file (``--config``, ``$EAGLEDATA_CONFIG``, ``./configs/``,
else the shipped one) with CLI flags over it, and the files shipped with the package
(``bundled:`` assets, the checkout's ``configs/`` and ``scripts/``)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eagledata.config.app import AppConfig
from eagledata.config.validation import format_validation_error
from eagledata.errors import ConfigError

BUNDLED_PREFIX = "bundled:"
DEFAULT_CONFIG_ENV = "EAGLEDATA_CONFIG"
DEFAULT_CONFIG_PATH = Path("configs/eagledata.toml")


def resolve_bundled(value: str) -> str:
    """Map ``bundled:REL`` to the path of a file shipped in ``eagledata/assets``."""
    if not value.startswith(BUNDLED_PREFIX):
        return value
    relative = value[len(BUNDLED_PREFIX) :].strip("/")
    path = Path(str(resources.files("eagledata").joinpath("assets", *relative.split("/"))))
    if not path.exists():
        raise ConfigError(f"{value}: no such bundled asset (looked in {path})")
    return str(path)


def default_config_path() -> Path | None:
    """``$EAGLEDATA_CONFIG``, else ``./configs/eagledata.toml``, else the reference config shipped
    in the package: the same settings from any directory, a local ``configs/`` still first."""
    env = os.environ.get(DEFAULT_CONFIG_ENV)
    if env:
        return Path(env)
    if DEFAULT_CONFIG_PATH.is_file():
        return DEFAULT_CONFIG_PATH
    return shipped_path(DEFAULT_CONFIG_PATH.as_posix())


def load_config(
    path: Path | None,
    overrides: dict[str, Any] | None = None,
    flag_names: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> AppConfig:
    """Load a TOML config, apply dotted-key overrides (CLI flags), validate strictly.

    ``flag_names`` maps an override's key to the flag that set it (``run.concurrency`` ->
    ``--concurrency``): a bad value is then blamed on the flag, not on the config file.

    ``defaults`` (dotted keys: what ``--model`` says of the model) lie beneath the file: a key
    the file sets wins over them, and a flag over both.

    Relative paths inside the file resolve against the current directory; shipped assets are
    named ``bundled:...`` so the demo config works from any directory.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found; pass --config FILE") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from None
    for dotted, value in (defaults or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node.setdefault(leaf, value)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    if "tokenizer" not in raw:
        raise ConfigError(
            "tokenizer.name: missing; pass --model DIR (or --tokenizer), or set it in the config"
        )
    try:
        config = AppConfig.model_validate(raw)
    except ValidationError as exc:
        names = flag_names or {}
        flags = {
            key: names.get(key, "command line")
            for key, value in (overrides or {}).items()
            if value is not None
        }
        source = f"{path}: " if path is not None else ""
        raise ConfigError(format_validation_error(exc, source, flags, AppConfig)) from None
    config._source = str(path) if path is not None else None
    return config


# --- files shipped with the package (setup.py copies them from the checkout at build time) ----

SHIPPED_DIR = "_shipped"
_CHECKOUT = Path(__file__).resolve().parents[3]  # src/eagledata/config/loading.py -> checkout


def shipped_path(relative: str) -> Path | None:
    """A file of the checkout's ``configs/`` or ``scripts/``, wherever eagledata is installed.

    A wheel carries them in ``eagledata/_shipped/`` (``setup.py``); a checkout, or an editable
    install of one, has them at its top level. None when neither has ``relative``.
    """
    packaged = resources.files("eagledata").joinpath(SHIPPED_DIR, *relative.split("/"))
    if packaged.is_file() or packaged.is_dir():
        return Path(str(packaged))
    in_checkout = _CHECKOUT / relative
    if (_CHECKOUT / "pyproject.toml").is_file() and in_checkout.exists():
        return in_checkout
    return None
