"""A session's first contact with its servers, before any production request.

Reach every server, check it (invariant 2: the KV guard), derive the prompt length limit from what
the servers report, and set the load controller over them (routers read through their workers).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from eagledata.config import AppConfig
from eagledata.errors import ConfigError, EagledataError, ServerRefusedError, ServerUnavailableError
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.source.tokenization import LengthLimit

log = logging.getLogger(__name__)


async def first_contact(
    client: SGLangClient,
    guard: KVGuard,
    config: AppConfig,
    run_dir: RunDir,
    expected_model: str | None,
) -> LengthLimit:
    """Reach every server, check it (invariant 2), and derive the prompt length limit."""
    reachable = [endpoint for endpoint in client.endpoints if await client.health(endpoint.url)]
    for endpoint in client.endpoints:
        endpoint.healthy = endpoint in reachable
    if not reachable:
        urls = ", ".join(endpoint.url for endpoint in client.endpoints)
        raise ServerUnavailableError(
            f"cannot reach an SGLang server at {urls}; start one (eagledata launch-server) "
            "or fix --server"
        )
    for endpoint in client.endpoints:
        if endpoint not in reachable:
            log.warning("%s does not answer /health at the start", endpoint.url)
    try:
        facts = [await guard.check(endpoint.url) for endpoint in reachable]
    except ServerRefusedError as refused:
        log.error("a server was refused at the start: %s", refused)
        raise _name_the_model_setting(refused, config, run_dir, expected_model) from None
    for endpoint, fact in zip(reachable, facts, strict=True):
        log.info(
            "%s passed the KV check at the start: model %s, KV cache %s, SGLang %s",
            endpoint.url,
            fact.model_path,
            fact.kv_cache_dtype,
            fact.version,
        )
    input_limits = [f.max_req_input_len for f in facts if f.max_req_input_len is not None]
    contexts = [f.context_length for f in facts if f.context_length is not None]
    check_max_new_tokens(config, min(contexts, default=None))
    return LengthLimit.combine(
        configured_cap=config.generation.max_prompt_tokens,
        max_req_input_len=min(input_limits, default=None),
        context_length=min(contexts, default=None),
        max_new_tokens=config.generation.max_new_tokens,
    )


def check_max_new_tokens(config: AppConfig, context_length: int | None) -> None:
    """``max_new_tokens`` against the server's context, before the run is created: SGLang
    refuses a request whose prompt and ``max_new_tokens`` reach ``context_length``, so a value
    that leaves no room for a one-token prompt would fail every item (and be frozen)."""
    asked = config.generation.max_new_tokens
    if context_length is None or asked <= context_length - 2:
        return
    raise ConfigError(
        f"generation.max_new_tokens is {asked:,}, but the server's context_length is "
        f"{context_length:,}: no prompt would fit; pass --max-new-tokens of at most "
        f"{context_length - 2:,} (less the longest prompt)"
    )


async def load_controller(
    client: SGLangClient,
    guard: KVGuard,
    config: AppConfig,
    fixed: int | None,
    telemetry: TelemetryLog,
    progress: Progress,
    known_lengths: Sequence[int] = (),
) -> LoadController:
    """The load controller over every server, routers read through their workers, its answer
    lengths seeded with ``known_lengths`` (what the run's records already hold, oldest first:
    a resumed run does not start from the pessimistic prior again)."""
    load = LoadController(
        client,
        config.load,
        fixed=fixed,
        max_new_tokens=config.generation.max_new_tokens,
        telemetry=telemetry,
        note=lambda message: _note(progress, message),
        facts_of=guard.facts.get,
    )
    load.lengths.seed(known_lengths)
    for endpoint in client.endpoints:
        workers = None
        if endpoint.healthy:
            with contextlib.suppress(EagledataError):
                workers = await client.router_workers(endpoint.url)
        facts = guard.facts.get(endpoint.url)
        if facts is not None and facts.release_note is not None:
            progress.note(f"{endpoint.url}: {facts.release_note}")  # once, at the start
        load.add_server(ServerPlan(endpoint.url, facts, workers))
    return load


def _note(progress: Progress, message: str) -> None:
    """The load controller's notes: beside the live bar, and in ``run.log``."""
    log.warning("%s", message)
    progress.note(message)


def _name_the_model_setting(
    refused: ServerRefusedError, config: AppConfig, run_dir: RunDir, expected: str | None
) -> ServerRefusedError:
    """A refusal for serving another model says which setting asked for the model."""
    if expected is None or f"expected {expected!r}" not in str(refused):
        return refused
    if run_dir.exists():
        where = f"frozen in {run_dir.run_json} when the run started"
        fix = f"point --server at a server of {expected}, or start a new run with --out"
    else:
        where = f"in {config.source}" if config.source else "in the config"
        fix = f"serve {expected}, or change server.expected_model {where} (or pass --config)"
    return ServerRefusedError(
        f"{refused}; server.expected_model is {expected!r}, {where}. Fix: {fix}"
    )
