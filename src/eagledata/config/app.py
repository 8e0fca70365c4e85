"""The whole settings of eagledata (``AppConfig``), and the part a run freezes into ``run.json``
(``FrozenSettings``, with its fingerprint) and refuses to change on resume."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from pydantic import Field, PrivateAttr, field_validator

from eagledata.config.data import (
    DatasetSettings,
    GenerationSettings,
    MixSettings,
    TokenizerSettings,
)
from eagledata.config.operation import CanarySettings, LoadSettings, RunSettings, ServerSettings
from eagledata.config.validation import Strict
from eagledata.errors import ConfigError


class AppConfig(Strict):
    tokenizer: TokenizerSettings
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    datasets: dict[str, DatasetSettings] = Field(default_factory=dict)
    mixes: dict[str, MixSettings] = Field(default_factory=dict)
    canary: CanarySettings = Field(default_factory=CanarySettings)

    @field_validator("datasets", "mixes")
    @classmethod
    def _names_without_slash(cls, table: dict[str, Any]) -> dict[str, Any]:
        for name in table:
            if not name or "/" in name:
                raise ValueError(
                    f"{name!r}: a name may not be empty or hold '/' (it starts every record id)"
                )
        return table

    # the file it was read from, for errors that name a setting (not part of the settings)
    _source: str | None = PrivateAttr(default=None)

    @property
    def source(self) -> str | None:
        return self._source


class MixMember(Strict):
    """One dataset of a run: its settings, and what share or count of its rows the run takes."""

    name: str
    dataset: DatasetSettings
    rows: int | None = Field(None, ge=1, description="Take this many of its rows")
    share: float | None = Field(None, gt=0.0, le=1.0, description="Take this share of its rows")


LATER_SETTINGS = ("kv_heads",)
"""Frozen settings added after runs were first made: absent from a fingerprint when unset."""
LATER_TOKENIZER_SETTINGS = ("chat_template",)
LATER_GENERATION_DEFAULTS = {"round": 0}
"""Generation settings added later: absent from a fingerprint while they hold their default."""


class FrozenSettings(Strict):
    """Everything that shapes the data of a run. Changing any of it would mix two datasets.

    A run of one whole dataset keeps the shape runs always had (``dataset_name``, ``dataset``);
    a run of several (``--dataset`` repeated, or a ``[mixes.NAME]``) lists them in ``mix``.
    """

    dataset_name: str
    dataset: DatasetSettings | None = None
    mix: list[MixMember] = Field(default_factory=list)
    mix_seed: int = 0
    tokenizer: TokenizerSettings
    generation: GenerationSettings
    limit: int | None
    shard_size: int
    expected_model: str | None
    bf16_kv_bytes_per_token: int | None
    kv_heads: int | None = None

    @classmethod
    def of(
        cls, config: AppConfig, name: str, members: list[MixMember], seed: int = 0
    ) -> FrozenSettings:
        """What a run started with ``config`` on ``members`` (its datasets) freezes."""
        single = len(members) == 1 and members[0].rows is None and members[0].share is None
        return cls(
            dataset_name=name,
            dataset=members[0].dataset if single else None,
            mix=[] if single else list(members),
            mix_seed=0 if single else seed,
            tokenizer=config.tokenizer,
            generation=config.generation,
            limit=config.run.limit,
            shard_size=config.run.shard_size,
            expected_model=config.server.expected_model,
            bf16_kv_bytes_per_token=config.server.bf16_kv_bytes_per_token,
            kv_heads=config.server.kv_heads,
        )

    def members(self) -> list[MixMember]:
        """The run's datasets, in the order the plan interleaves them."""
        if self.mix:
            return list(self.mix)
        if self.dataset is None:
            raise ConfigError("frozen settings name no dataset")
        return [MixMember(name=self.dataset_name, dataset=self.dataset)]

    def fingerprint(self) -> str:
        """The settings' hash; a setting added since runs were first made counts only when
        set, so a run made before it keeps its fingerprint."""
        dumped = self.model_dump(mode="json", by_alias=True)
        for key in LATER_SETTINGS:
            if dumped.get(key) is None:
                dumped.pop(key, None)
        tokenizer = dumped.get("tokenizer")
        if isinstance(tokenizer, dict):
            for key in LATER_TOKENIZER_SETTINGS:
                if tokenizer.get(key) is None:
                    tokenizer.pop(key, None)
        generation = dumped.get("generation")
        if isinstance(generation, dict):
            for key, default in LATER_GENERATION_DEFAULTS.items():
                if generation.get(key) == default:
                    generation.pop(key, None)
        blob = orjson.dumps(dumped, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(blob).hexdigest()[:16]
