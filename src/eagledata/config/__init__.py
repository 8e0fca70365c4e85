"""Settings: strict pydantic models, loaded from TOML, overridden by CLI flags.

A run freezes the data-shaping part of its settings (``FrozenSettings``) into ``run.json``; resume
refuses to continue if any of it would change. Only server addresses and concurrency may change.

``data`` holds the settings that shape the data (tokenizer, generation, datasets, mixes),
``operation`` those of how a run operates (servers, run, load, canary), ``app`` the whole
(``AppConfig``) and what a run freezes, ``loading`` where they come from (the TOML file, flags,
shipped files), ``validation`` the strict base model and how a bad setting reads. Every public
name is here: import from ``eagledata.config``.
"""

from __future__ import annotations

from eagledata.config.app import AppConfig, FrozenSettings, MixMember
from eagledata.config.data import (
    DATASET_GENERATION_FIELDS,
    DatasetSettings,
    GenerationSettings,
    MixSettings,
    Schema,
    SchemaName,
    TokenizerSettings,
    Turns,
)
from eagledata.config.loading import (
    BUNDLED_PREFIX,
    DEFAULT_CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
    SHIPPED_DIR,
    default_config_path,
    load_config,
    resolve_bundled,
    shipped_path,
)
from eagledata.config.operation import (
    CanarySettings,
    LoadSettings,
    RunSettings,
    ServerSettings,
    SimulatedServerSettings,
)
from eagledata.config.validation import Strict, field_key, format_validation_error

__all__ = [
    "BUNDLED_PREFIX",
    "DATASET_GENERATION_FIELDS",
    "DEFAULT_CONFIG_ENV",
    "DEFAULT_CONFIG_PATH",
    "SHIPPED_DIR",
    "AppConfig",
    "CanarySettings",
    "DatasetSettings",
    "FrozenSettings",
    "GenerationSettings",
    "LoadSettings",
    "MixMember",
    "MixSettings",
    "RunSettings",
    "Schema",
    "SchemaName",
    "ServerSettings",
    "SimulatedServerSettings",
    "Strict",
    "TokenizerSettings",
    "Turns",
    "default_config_path",
    "field_key",
    "format_validation_error",
    "load_config",
    "resolve_bundled",
    "shipped_path",
]
