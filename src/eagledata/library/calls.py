"""``regenerate`` and ``aregenerate``: one round of a dataset or a list of prompts, from a program.

A call is ``eagledata generate`` into ``OUT/round-NNNN`` with the settings its arguments give
(over a config file when ``config=`` names one, over what ``model=`` says of the model, as
``--model`` does), run as the CLI runs it (the same KV guard, canary and checks) but embedded
(run/embedded.py): no signal handlers, no bar, nothing on stderr, progress to ``on_progress``.
Calling it again resumes that round where it stopped; each (row, sample) gets one outcome per
round.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eagledata.config import AppConfig, load_config
from eagledata.config.data import GenerationSettings
from eagledata.config.operation import CanarySettings, LoadSettings, RunSettings, ServerSettings
from eagledata.errors import ConfigError, UsageError
from eagledata.library.source import Source, resolve_source, round_dir, round_dirs
from eagledata.library.summary import RunSummary
from eagledata.run import pipeline
from eagledata.run.canary_setup import BASELINE_FILE
from eagledata.run.embedded import ProgressEvent, embedded
from eagledata.tasks import run_until_done

SECTIONS: tuple[tuple[str, type[Any]], ...] = (
    ("generation", GenerationSettings),
    ("run", RunSettings),
    ("server", ServerSettings),
    ("load", LoadSettings),
    ("canary", CanarySettings),
)
"""Where a keyword setting is looked up, in this order (``samples_per_prompt``, ``limit``, ...)."""
OWN_ARGUMENTS = {
    "generation.round": "round=",
    "generation.max_new_tokens": "max_new_tokens=",
    "generation.temperature": "temperature=",
    "server.urls": "server=",
    "tokenizer.name": "tokenizer=",
}


def setting_key(name: str) -> str:
    """The dotted key of a keyword setting: ``samples_per_prompt`` -> ``generation.
    samples_per_prompt``; a dotted name (``**{"server.guard_interval_s": 1}``) is taken as is;
    ``canary=False`` is ``canary.enabled``."""
    if "." in name:
        return name
    if name == "canary":
        return "canary.enabled"
    for section, model in SECTIONS:
        if name in model.model_fields:
            return f"{section}.{name}"
    raise ConfigError(
        f"{name}=: no such setting; pass a field of [generation], [run], [server], [load] or "
        "[canary] (docs/configuration.md), or a dotted key such as **{'server.guard_interval_s': 1}"
    )


def build_config(
    *,
    round_index: int,
    server: str | Sequence[str] | None,
    model: str | None,
    tokenizer: str | None,
    config: str | os.PathLike[str] | None,
    max_new_tokens: int | None,
    temperature: float | None,
    settings: Mapping[str, Any],
    source_overrides: Mapping[str, Any],
) -> AppConfig:
    """The settings of one call: its arguments over ``config`` (a TOML file; else
    ``$EAGLEDATA_CONFIG``; else none) over what ``model`` says of the model."""
    defaults: dict[str, Any] = {}
    if model is not None:
        from eagledata.profiles.target import resolve_target

        defaults = resolve_target(model).settings()
    env = os.environ.get("EAGLEDATA_CONFIG")
    path = Path(config) if config is not None else (Path(env) if env else None)
    urls = [server] if isinstance(server, str) else None if server is None else list(server)
    overrides: dict[str, Any] = {
        "generation.round": round_index,
        "generation.max_new_tokens": max_new_tokens,
        "generation.temperature": temperature,
        "server.urls": urls,
        "tokenizer.name": tokenizer,
        **source_overrides,
    }
    if urls:  # a server given replaces a config's simulated one
        overrides["server.simulated.enabled"] = False
    names = dict(OWN_ARGUMENTS)
    for name, value in settings.items():
        key = setting_key(name)
        overrides[key] = value
        names[key] = f"{name}="
    return load_config(path, overrides, names, defaults)


def _arguments(
    source: Source,
    out: str | os.PathLike[str],
    round_index: int,
    settings: dict[str, Any],
) -> tuple[AppConfig, str, Path]:
    if isinstance(round_index, bool) or not isinstance(round_index, int) or round_index < 0:
        raise ConfigError(f"round={round_index!r}: a round is an integer 0 or more")
    root = Path(out)
    resolved = resolve_source(source, root)
    config = build_config(round_index=round_index, source_overrides=resolved.overrides, **settings)
    return (
        with_first_baseline(config, root, round_index),
        resolved.dataset_arg,
        round_dir(root, round_index),
    )


def with_first_baseline(config: AppConfig, root: Path, round_index: int) -> AppConfig:
    """A round after the first is checked against the canary baseline of the earliest round
    that has one (unless a baseline is named): every round compares the servers with one
    reference, so a server that changed between rounds is refused, and a round does not spend
    its start recording a baseline of its own."""
    canary = config.canary
    if not canary.enabled or canary.baseline is not None:
        return config
    for earlier, path in round_dirs(root).items():
        baseline = path / BASELINE_FILE
        if earlier < round_index and baseline.is_file():
            update = {"canary": canary.model_copy(update={"baseline": baseline})}
            return config.model_copy(update=update)
    return config


async def aregenerate(
    source: Source,
    *,
    server: str | Sequence[str] | None,
    out: str | os.PathLike[str],
    round: int = 0,
    model: str | None = None,
    tokenizer: str | None = None,
    config: str | os.PathLike[str] | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    **settings: Any,
) -> RunSummary:
    """``regenerate`` as a coroutine, on the caller's running event loop (it never starts one).
    Cancelling it stops the round where it is: what was committed stays, calling it again
    resumes the round, and the cancellation goes on to the caller."""
    config_, dataset_arg, run_path = _arguments(
        source,
        out,
        round,
        {
            "server": server,
            "model": model,
            "tokenizer": tokenizer,
            "config": config,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "settings": settings,
        },
    )
    with embedded(on_progress):
        summary = await pipeline.agenerate(config_, dataset_arg, run_path)
    return RunSummary.of(summary, round)


def regenerate(
    source: Source,
    *,
    server: str | Sequence[str] | None,
    out: str | os.PathLike[str],
    round: int = 0,
    model: str | None = None,
    tokenizer: str | None = None,
    config: str | os.PathLike[str] | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    **settings: Any,
) -> RunSummary:
    """Generate round ``round`` of ``source`` into ``out/round-NNNN`` and return its summary;
    again on the same round resumes it. From any thread without a running event loop (inside
    one: ``await aregenerate(...)``). Errors are ``eagledata.errors``' tree."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "regenerate() was called inside a running event loop, which it would block; "
            "use 'await eagledata.aregenerate(...)' there (or call regenerate from a thread)"
        )
    return run_until_done(
        aregenerate(
            source,
            server=server,
            out=out,
            round=round,
            model=model,
            tokenizer=tokenizer,
            config=config,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            on_progress=on_progress,
            **settings,
        )
    )
