"""The library's entry points: ``generate`` and ``resume``; the CLI only parses flags.
``agenerate`` is ``generate`` on the caller's event loop (``library/``: ``aregenerate``).

Each resolves its settings and datasets (one, or a mix: ``source/mix.py``), locks the run
directory, checks what is frozen in it, and runs one session (``run/session.py``: the steps wired
together) in ``_execute``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eagledata.config import AppConfig, FrozenSettings, field_key, format_validation_error
from eagledata.errors import ConfigError, EagledataError, RunDirError
from eagledata.run.progress import Summary
from eagledata.run.session import Run
from eagledata.run.session_state import SessionSettings
from eagledata.rundir.manifest import RunDir
from eagledata.simserver.demo import simulated_server
from eagledata.source.dataset import ResolvedDataset, check_local_source
from eagledata.source.fingerprint import check_datasets, record_datasets
from eagledata.source.mix import Mix, resolve_mix
from eagledata.source.preflight import check_first_rows
from eagledata.tasks import run_until_done


def default_out_dir(mix: Mix) -> Path:
    return Path("runs") / mix.name


def _check_sources(mix: Mix, where: str | None) -> None:
    """Every local data file is there, before the run dir, the tokenizer and the servers."""
    for member in mix.members:
        check_local_source(ResolvedDataset(member.name, member.dataset), where)


@dataclass
class _Session:
    run: Run
    removed: bool = False
    """A new run stopped while starting: its folders were removed, nothing to resume."""

    def summary(self, summary: Summary) -> Summary:
        # stopped while starting a new run: nothing is left to resume, the command is run again
        return replace(summary, resumable=False) if self.removed else summary


@contextlib.contextmanager
def _session(
    config: AppConfig,
    mix: Mix,
    out_dir: Path,
    progress: bool,
    retry_failed: bool = False,
) -> Iterator[_Session]:
    """The run directory locked and checked, the simulated server up if the config asks for
    it: one session to run, synchronously (``_execute``) or on the caller's loop
    (``agenerate``)."""
    created = _first_missing(out_dir)
    run_dir = RunDir(out_dir)
    run_dir.lock()
    session: _Session | None = None
    try:
        existed = run_dir.exists()
        if existed:  # its rows are named as when it started (``ROW_ID_SCHEME``)
            mix = replace(mix, id_scheme=run_dir.manifest().row_id_scheme)
        frozen = FrozenSettings.of(config, mix.name, list(mix.members), mix.seed)
        datasets: dict[str, Any] = {}
        if existed:
            run_dir.check_frozen(frozen)
            _check_canary_frozen(run_dir, config)
            _check_datasets(run_dir, mix, config.run.limit)
            if retry_failed:
                run_dir.requeue_failures()  # under the lock: no other process writes failures
        else:  # before the servers: a dataset that cannot be read costs no start-up
            datasets = record_datasets(out_dir, list(mix.members), config.run.limit, mix.id_scheme)
        with simulated_server(config) as live_config:
            settings = SessionSettings(live_config, mix, run_dir, frozen, progress, datasets)
            session = _Session(Run(settings))
            yield session
    except EagledataError as error:
        raise error.naming_run_dir(out_dir) from None
    finally:
        run_dir.unlock()
        removed = created is not None and _remove_unstarted(created, run_dir)
        if session is not None:
            session.removed = removed


def _execute(
    config: AppConfig,
    mix: Mix,
    out_dir: Path,
    progress: bool,
    retry_failed: bool = False,
) -> Summary:
    with _session(config, mix, out_dir, progress, retry_failed) as session:
        summary = run_until_done(session.run.execute())
    return session.summary(summary)


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None: ``path`` exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        missing = folder
    return missing


def _remove_unstarted(created: Path, run_dir: RunDir) -> bool:
    """A start that did not start leaves nothing behind: the folders this session created are
    removed when it ends without a ``run.json`` (written once every server has passed: no
    server, settings or a server refused, an empty dataset, a stop while starting). A folder
    that existed before the session is never touched; a run that started is kept, to resume.
    Returns whether they were removed."""
    if run_dir.exists():
        return False
    shutil.rmtree(created, ignore_errors=True)
    return True


def _check_datasets(run_dir: RunDir, mix: Mix, row_limit: int | None) -> None:
    """The datasets the run was started with, row for row (``source/fingerprint.py``); rows
    added at their end are planned: the plan is read to its end again."""
    stored = run_dir.manifest().datasets
    if stored is None:
        return  # a run started before datasets were recorded
    members = list(mix.members)
    updated, grew = check_datasets(run_dir.path, members, stored, row_limit, mix.id_scheme)
    if updated is None:
        return
    if grew:
        (run_dir.path / "plan.json").unlink(missing_ok=True)
        run_dir.update(datasets=updated, planned_estimate=None)
    else:
        run_dir.update(datasets=updated)


def _check_canary_frozen(run_dir: RunDir, config: AppConfig) -> None:
    """``--no-canary`` is chosen when a run starts and kept for its life."""
    stored = run_dir.manifest().canary
    if stored is not None and stored.enabled != config.canary.enabled:
        was = "with the canary" if stored.enabled else "with --no-canary"
        raise RunDirError(
            f"{run_dir.path} was started {was}; that choice is frozen: continue it with "
            "'eagledata resume RUN_DIR' or pass a new --out"
        )


def generate(
    config: AppConfig,
    dataset_arg: str | list[str],
    out_dir: Path | None,
    *,
    progress: bool = True,
) -> Summary:
    """Generate ``dataset_arg`` (one ``--dataset`` value, or several: one run of them all)."""
    mix = _resolved_mix(config, dataset_arg)
    out = out_dir or config.run.out_dir or default_out_dir(mix)
    return _execute(config, mix, out, progress)


async def agenerate(
    config: AppConfig,
    dataset_arg: str | list[str],
    out_dir: Path | None,
    *,
    progress: bool = False,
) -> Summary:
    """``generate`` on the caller's running event loop (the library's ``aregenerate``); the
    settings, the checks and the session are the same. Cancelling it stops the session (the
    files closed, what was committed kept) and the cancellation goes on to the caller."""
    mix = _resolved_mix(config, dataset_arg)
    out = out_dir or config.run.out_dir or default_out_dir(mix)
    with _session(config, mix, out, progress) as session:
        summary = await session.run.execute()
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # the session ended early for a cancel
            raise asyncio.CancelledError
    return session.summary(summary)


def _resolved_mix(config: AppConfig, dataset_arg: str | list[str]) -> Mix:
    arguments = [dataset_arg] if isinstance(dataset_arg, str) else list(dataset_arg)
    mix = resolve_mix(arguments, config)
    _check_sources(mix, config.source)
    for member in mix.members:  # the cause first: rows of an unknown shape stop it here
        check_first_rows(ResolvedDataset(member.name, member.dataset), config.source)
    return mix


def resume(
    run_path: Path,
    *,
    server_urls: list[str] | None = None,
    concurrency: int | str | None = None,
    retry_failed: bool = False,
    progress: bool = True,
) -> Summary:
    run_dir = RunDir(run_path)
    manifest = run_dir.manifest()
    if manifest.config is None:
        raise RunDirError(f"{run_path}/run.json lacks its settings; start a new run")
    config = stored_config(run_dir, manifest.config, server_urls, concurrency)
    # A run from before the canary existed has none: resume keeps it that way.
    enabled = manifest.canary_enabled
    config = config.model_copy(
        update={"canary": config.canary.model_copy(update={"enabled": enabled})}
    )
    mix = Mix.of(run_dir.frozen())
    _check_sources(mix, f"{run_path}/run.json")
    return _execute(config, mix, run_path, progress, retry_failed)


RESUME_FLAGS = {"server.urls": "--server", "run.concurrency": "--concurrency"}
"""What resume may change, by the flag that changes it."""


def stored_config(
    run_dir: RunDir,
    stored: dict[str, Any],
    server_urls: list[str] | None,
    concurrency: int | str | None,
) -> AppConfig:
    """The settings a run was started with, checked again by this release, with what resume
    may change (the servers, the concurrency) put in first: a stored concurrency this release
    refuses never blocks ``resume --concurrency N``. A stored setting it refuses otherwise is
    named, key by key, in one line each."""
    raw = {
        section: dict(value) if isinstance(value, dict) else value
        for section, value in stored.items()
    }
    flags: set[str] = set()
    if server_urls:
        raw.setdefault("server", {})["urls"] = server_urls
        flags.add("server.urls")
    if concurrency:
        raw.setdefault("run", {})["concurrency"] = concurrency
        flags.add("run.concurrency")
    try:
        return AppConfig.model_validate(raw)
    except ValidationError as exc:
        named = {key: RESUME_FLAGS[key] for key in flags}
        problems = format_validation_error(exc, f"{run_dir.run_json}: ", named, AppConfig)
        keys = {".".join(field_key(error["loc"])) for error in exc.errors()}
        if keys <= flags:
            raise ConfigError(problems) from None
        if "run.concurrency" in keys - flags:
            fix = "pass --concurrency auto or N to resume"
        else:
            fix = (
                "the run was started with a setting this eagledata refuses: continue it with "
                "the eagledata version that started it, or start a new run with --out"
            )
        raise ConfigError(f"{problems}; {fix}") from None
