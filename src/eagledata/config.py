"""Settings: strict pydantic models, loaded from TOML, overridden by CLI flags.

A run freezes the data-shaping part of its settings (``FrozenSettings``) into ``run.json``; resume
refuses to continue if any of it would change. Only server addresses and concurrency may change.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from eagledata.errors import ConfigError

BUNDLED_PREFIX = "bundled:"
DEFAULT_CONFIG_ENV = "EAGLEDATA_CONFIG"
DEFAULT_CONFIG_PATH = Path("configs/eagledata.toml")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TokenizerSettings(Strict):
    name: str = Field(description="Hub id or local dir for AutoTokenizer; 'bundled:...' for assets")
    revision: str | None = None
    trust_remote_code: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)


Turns = Literal["last", "all"]
"""Which assistant turns of a conversation are regenerated: ``last`` (the answer to the last
user message, earlier answers kept as the dataset has them) or ``all`` (every one, in order,
each prompted with the regenerated answers before it)."""


class GenerationSettings(Strict):
    max_new_tokens: int = Field(4096, ge=1)
    temperature: float = Field(0.6, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    samples_per_prompt: int = Field(1, ge=1, le=64)
    stop_token_ids: list[int] | None = None
    max_prompt_tokens: int | None = Field(None, ge=1)
    turns: Turns = Field(
        "last",
        description="'last': regenerate the last assistant turn; 'all': every assistant turn, "
        "in order, each prompted with the regenerated answers before it",
    )
    dedupe: bool = Field(
        True,
        description="Generate a prompt (the same prompt ids) once: later copies are skipped "
        "with the reason 'duplicate'",
    )

    @field_validator("top_k")
    @classmethod
    def _top_k_not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("top_k must be -1 (all) or >= 1")
        return value

    def sampling_params(self) -> dict[str, Any]:
        """The ``sampling_params`` sent with every request; ``max_new_tokens`` always explicit."""
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        return params


SchemaName = Literal["auto", "sharegpt", "messages", "prompt"]


class DatasetSettings(Strict):
    source: str = Field(description="Local .jsonl/.json/.parquet path, hub id, or 'bundled:...'")
    subset: str | None = Field(None, description="Hub config name")
    split: str = "train"
    schema_: SchemaName = Field("auto", alias="schema")
    id_field: str | None = Field(None, description="Column holding a stable id; row index if none")
    prompt_field: str = "prompt"
    system_prompt: str | None = None
    # Generation settings of this dataset alone (None: the run's [generation] / [tokenizer]).
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_new_tokens: int | None = Field(None, ge=1)
    samples_per_prompt: int | None = Field(None, ge=1, le=64)
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Merged over tokenizer.chat_template_kwargs (e.g. thinking on or off)"
    )
    turns: Turns | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def generation(self, base: GenerationSettings) -> GenerationSettings:
        """``base`` with this dataset's own values in place of the run's."""
        own = {
            name: getattr(self, name)
            for name in DATASET_GENERATION_FIELDS
            if getattr(self, name) is not None
        }
        return base.model_copy(update=own) if own else base

    def template_kwargs(self, base: dict[str, Any]) -> dict[str, Any]:
        """The ``chat_template_kwargs`` its prompts are rendered with: the tokenizer's, then its
        own over them."""
        return {**base, **(self.chat_template_kwargs or {})}


DATASET_GENERATION_FIELDS = (
    "temperature",
    "top_p",
    "max_new_tokens",
    "samples_per_prompt",
    "turns",
)
"""The ``[generation]`` settings a ``[datasets.NAME]`` entry may set for itself."""


class MixSettings(Strict):
    """``[mixes.NAME]``: several datasets in one run, each a row count or a share of its rows."""

    seed: int = Field(0, description="Which rows a share or a row count takes")
    datasets: dict[str, int | float] = Field(
        min_length=1,
        description="dataset -> rows (an integer: that many of its rows) or share (a number in "
        "(0, 1]: that fraction of its rows), chosen with the seed",
    )

    @field_validator("datasets")
    @classmethod
    def _amounts(cls, datasets: dict[str, int | float]) -> dict[str, int | float]:
        for name, amount in datasets.items():
            if isinstance(amount, bool):
                raise ValueError(f"{name}: a row count (integer) or a share (0 < share <= 1)")
            if isinstance(amount, int) and amount < 1:
                raise ValueError(f"{name}: a row count must be at least 1, got {amount}")
            if isinstance(amount, float) and not 0.0 < amount <= 1.0:
                raise ValueError(f"{name}: a share must be in (0, 1], got {amount}")
        return datasets


class SimulatedServerSettings(Strict):
    """Start eagledata's own simulated SGLang server on loopback and use it (demo, tests)."""

    enabled: bool = False
    options: dict[str, Any] = Field(default_factory=dict, description="SimConfig fields")


class ServerSettings(Strict):
    urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:30000"], min_length=1)
    api_key_env: str = "SGLANG_API_KEY"
    expected_model: str | None = Field(None, description="Refuse a server serving another model")
    bf16_kv_bytes_per_token: int | None = Field(
        None, ge=1, description="The model's bf16 KV bytes/token (Kimi-K2.5: 70272)"
    )
    connect_timeout_s: float = Field(10.0, gt=0)
    request_timeout_s: float = Field(
        3600.0, gt=0, description="A request's whole life, connect to last byte (not per read)"
    )
    guard_interval_s: float = Field(60.0, gt=0)
    guard_max_held: int = Field(256, ge=1)
    guard_max_hold_s: float = Field(
        300.0,
        gt=0,
        description="A check of a server is due once one of its results has waited this long: "
        "a crash loses at most this window of answers",
    )
    down_deadline_s: float = Field(1800.0, ge=0)
    max_attempts: int = Field(5, ge=1)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    connections_per_pool: int = Field(8, ge=1, le=1024)
    simulated: SimulatedServerSettings = Field(default_factory=SimulatedServerSettings)

    @field_validator("urls")
    @classmethod
    def _urls_are_http(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:30000")
        return [url.rstrip("/") for url in urls]


class RunSettings(Strict):
    out_dir: Path | None = None
    shard_size: int = Field(1000, ge=1)
    concurrency: int | Literal["auto"] = Field(
        "auto", description="'auto' (sized from the server's load) or a fixed in-flight cap"
    )
    limit: int | None = Field(None, ge=1)
    fsync_interval_s: float = Field(1.0, ge=0)
    watchdog_s: float | None = Field(
        None,
        gt=0,
        description="Seconds without progress (no answer, record or check) before a run writes "
        "a task dump and says where it waits; unset: derived from [server] (run/watchdog.py)",
    )

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: Any) -> Any:
        """'auto' or 1..65536, however it is spelled: ``-5``, ``"-5"`` (a flag, a TOML string)
        and ``8.5`` are refused here, before pydantic's coercion could let them through."""
        if isinstance(value, str) and value.strip() != "auto":
            try:
                value = int(value)
            except ValueError:
                raise ValueError("must be 'auto' or an integer from 1 to 65536") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            return value.strip()
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
            raise ValueError("must be 'auto' or an integer from 1 to 65536")
        return value


class LoadSettings(Strict):
    """``--concurrency auto``: the load controller (``capacity/controller.py``) and telemetry."""

    poll_interval_s: float = Field(1.0, gt=0, description="How often the load is read")
    telemetry_interval_s: float = Field(5.0, gt=0, description="telemetry.jsonl sample period")
    telemetry_max_bytes: int = Field(8 * 1024 * 1024, ge=4096)
    max_in_flight: int = Field(1024, ge=1, le=65536, description="Ceiling under auto")
    target_usage: float = Field(0.85, gt=0, le=1, description="Initial KV usage target u*")
    min_usage: float = Field(0.60, gt=0, le=1)
    max_usage: float = Field(0.95, gt=0, le=1)
    freeze_s: float = Field(120.0, ge=0, description="No increase this long after a retraction")
    creep_every_s: float = Field(30.0, gt=0, description="Period of the +0.01 increases")
    length_quantile: float = Field(0.9, gt=0, le=1, description="Answer-length percentile")
    overflow_quantile: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="Share of the sampled futures of what is in flight whose KV peak must stay "
        "within the target usage",
    )
    expected_output_tokens: int | None = Field(
        None, ge=1, description="Answer-length prior until 8 answers are in (max_new_tokens)"
    )


class CanarySettings(Strict):
    """The logprob canary (quality/canary.py, docs/quality.md). Sizes follow the protocol in
    docs/quality.md; the threshold rules are hypotheses until calibrated."""

    enabled: bool = True
    baseline: Path | None = Field(None, description="A shared baseline file (eagledata canary)")
    prompts: int = Field(24, ge=1, description="Teacher-forced references, from the dataset")
    reference_tokens: int = Field(512, ge=2)
    max_prompt_tokens: int = Field(3000, ge=2)
    probes: int = Field(8, ge=0, description="Greedy decode probes")
    probe_tokens: int = Field(256, ge=1)
    top_logprobs: int = Field(20, ge=0)
    baseline_idle_runs: int = Field(3, ge=1)
    baseline_load_runs: int = Field(3, ge=0)
    load_requests: int = Field(16, ge=1, description="Concurrent requests of the load runs")
    period_s: float = Field(1200.0, gt=0)
    mean_shift_factor: float = Field(4.0, gt=0)
    mean_shift_floor: float = Field(1e-3, ge=0)
    trimmed_abs_factor: float = Field(3.0, gt=0)
    trimmed_abs_margin: float = Field(5e-3, ge=0)
    topk_kl_factor: float = Field(4.0, gt=0)
    topk_kl_floor: float = Field(5e-4, ge=0)
    top1_flip_factor: float = Field(4.0, gt=0)
    top1_flip_floor: float = Field(0.01, ge=0)
    greedy_divergence_factor: float = Field(0.5, gt=0, le=1)
    hard_trimmed_abs: float = Field(0.05, gt=0)
    hard_top1_flip: float = Field(0.05, gt=0)


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
        )

    def members(self) -> list[MixMember]:
        """The run's datasets, in the order the plan interleaves them."""
        if self.mix:
            return list(self.mix)
        if self.dataset is None:
            raise ConfigError("frozen settings name no dataset")
        return [MixMember(name=self.dataset_name, dataset=self.dataset)]

    def fingerprint(self) -> str:
        blob = orjson.dumps(
            self.model_dump(mode="json", by_alias=True), option=orjson.OPT_SORT_KEYS
        )
        return hashlib.sha256(blob).hexdigest()[:16]


_TYPE_TAGS = frozenset({"int", "str", "float", "bool", "none", "list", "dict"})


def field_key(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    """The settings key of an error: pydantic appends the branch of a union it tried (``int``,
    ``literal['auto']``, ``function-after[...]``), which is no key anyone wrote."""
    parts = [str(part) for part in loc]
    while parts and ("[" in parts[-1] or parts[-1] in _TYPE_TAGS):
        parts.pop()
    return tuple(parts)


def _near_keys(model: type[BaseModel], path: tuple[str, ...]) -> list[str]:
    """The keys a misspelled ``path`` may have meant, from the model's own fields at its level."""
    node: type[BaseModel] = model
    for part in path[:-1]:
        field = node.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        node = annotation
    return difflib.get_close_matches(path[-1], list(node.model_fields), n=1, cutoff=0.75)


def format_validation_error(
    error: ValidationError,
    source: str = "",
    flags: Mapping[str, str] | frozenset[str] = frozenset(),
    model: type[BaseModel] | None = None,
) -> str:
    """One line per key in error: ``source: key.path: message``; a key set by a flag names the
    flag (``--concurrency 'abc': ...``, from ``flags``: key -> flag), a misspelled key the key
    it may have meant (from ``model``'s fields). A union's branches are one line, not one each."""
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for item in error.errors():
        by_key.setdefault(field_key(item["loc"]), []).append(dict(item))
    lines = []
    for path, items in by_key.items():
        key = ".".join(path)
        messages = list(dict.fromkeys(str(i["msg"]).removeprefix("Value error, ") for i in items))
        message = "; or ".join(messages)
        if any(i["type"] == "extra_forbidden" for i in items) and model is not None:
            near = _near_keys(model, path)
            message = "unknown key" + (f"; did you mean {near[0]!r}?" if near else "")
        flag = (
            flags.get(key)
            if isinstance(flags, Mapping)
            else ("command line" if key in flags else None)
        )
        if flag is not None:
            value = items[0].get("input")
            shown = f" {value!r}" if isinstance(value, str | int | float) else ""
            lines.append(f"{flag}{shown}: {message}")
        else:
            lines.append(f"{source}{key}: {message}" if key else f"{source}{message}")
    return "\n".join(lines)


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
) -> AppConfig:
    """Load a TOML config, apply dotted-key overrides (CLI flags), validate strictly.

    ``flag_names`` maps an override's key to the flag that set it (``run.concurrency`` ->
    ``--concurrency``): a bad value is then blamed on the flag, not on the config file.

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
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    if "tokenizer" not in raw:
        raise ConfigError("tokenizer.name: missing; set it in the config or pass --tokenizer")
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
_CHECKOUT = Path(__file__).resolve().parents[2]  # src/eagledata/config.py -> the checkout


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
