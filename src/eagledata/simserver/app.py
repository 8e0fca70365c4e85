"""The aiohttp application: SGLang's native routes, plus ``/_sim/control`` and ``/_sim/stats``."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from eagledata.errors import EagledataError
from eagledata.simserver import engine
from eagledata.simserver.config import (
    ModelSpec,
    SimConfig,
    model_info,
    resolve_model,
    server_info,
)
from eagledata.simserver.engine import (
    ABORTED,
    QUEUED,
    RUNNING,
    Item,
    QueueFullError,
    SamplingSpec,
    Scheduler,
    SimRequestError,
    abort_reason,
    bad_body,
    bad_value,
)


@dataclass
class SimState:
    config: SimConfig
    model: ModelSpec
    scheduler: Scheduler = field(default_factory=Scheduler)
    started: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0
    attempts: dict[bytes, int] = field(default_factory=dict)


STATE = web.AppKey("sim_state", SimState)
JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON)


def _sse(body: Any) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


# --- /generate parsing ----------------------------------------------------------------------


@dataclass(slots=True)
class Parsed:
    pairs: list[tuple[Item, SamplingSpec]]
    single: bool
    stream: bool
    fault_key: bytes


def _prompts(obj: dict[str, Any], model: ModelSpec) -> tuple[list[list[int]], bool]:
    given = [k for k in ("text", "input_ids", "input_embeds") if obj.get(k) is not None]
    if len(given) != 1:
        raise bad_value("Either text, input_ids or input_embeds should be provided (only one).")
    if given[0] == "input_embeds":
        raise bad_value("input_embeds is not supported by the simulated server.")
    value = obj[given[0]]
    if given[0] == "text":
        if isinstance(value, str):
            return [model.encode(value)], True
        if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
            return [model.encode(t) for t in value], False
        raise bad_body("text must be a string or a non-empty list of strings")
    if not isinstance(value, list) or not value:
        raise bad_value("input_ids cannot be empty.")
    single = not isinstance(value[0], list)
    prompts = [value] if single else value
    for ids in prompts:
        if not isinstance(ids, list) or not ids:
            raise bad_value("input_ids cannot be empty.")
        if set(map(type, ids)) != {int}:
            raise bad_body("input_ids must be a list of integers or a list of such lists")
        if min(ids) < 0 or max(ids) >= model.vocab_size:
            raise bad_value(f"The input_ids contain a token id outside [0, {model.vocab_size}).")
    return prompts, single


def _rids(obj: dict[str, Any], prompts: int, n: int) -> list[str]:
    rid = obj.get("rid")
    total = prompts * n
    if rid is None:
        return [os.urandom(16).hex() for _ in range(total)]
    if isinstance(rid, str):
        return [rid] if total == 1 else [f"{rid}_{i}" for i in range(total)]
    if not isinstance(rid, list) or len(rid) != prompts or not all(isinstance(r, str) for r in rid):
        raise bad_value("The rid should be a string or a list of strings, one per prompt.")
    return list(rid) if n == 1 else [f"{r}_{j}" for r in rid for j in range(n)]


def parse_generate(obj: Any, state: SimState) -> Parsed:
    if not isinstance(obj, dict):
        raise bad_body("The request body must be a JSON object.")
    config, model = state.config, state.model
    stream = bool(obj.get("stream", False))
    prompts, single = _prompts(obj, model)
    raw = obj.get("sampling_params")
    if isinstance(raw, list):
        if len(raw) != len(prompts):
            raise bad_value("sampling_params list must have one entry per prompt.")
        specs = [engine.parse_sampling(r, model.vocab_size) for r in raw]
    else:
        specs = [engine.parse_sampling(raw, model.vocab_size)] * len(prompts)
    n = specs[0].n
    rids = _rids(obj, len(prompts), n)
    if len(set(rids)) != len(rids):
        raise bad_value(f"Duplicate request ID in the batch: {rids}")
    if config.version_tuple() >= (0, 5, 23):
        for rid in rids:
            if rid in state.scheduler.rid_counts:
                raise bad_value(f"Duplicate request ID {rid!r}: a request with it is in flight.")
    ctx, limit = config.context_length, config.max_req_input_len()
    budgets = []
    for ids, spec in zip(prompts, specs, strict=True):
        length = len(ids)
        max_new = engine.resolve_max_new(spec, length, config)
        if length >= ctx:
            raise bad_value(
                f"The input ({length} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
        if length + max_new >= ctx:
            raise bad_value(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {length + max_new} tokens: {length} tokens "
                f"from the input messages and {max_new} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the "
                "limit."
            )
        if length >= limit:
            raise bad_value(
                f"Input length ({length} tokens) exceeds the maximum allowed length ({limit} "
                "tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        budgets.append(max_new)
    pairs: list[tuple[Item, SamplingSpec]] = []
    fp8, dtype = config.is_fp8(), config.effective_kv_dtype()
    digests = []
    for ids, spec, max_new in zip(prompts, specs, budgets, strict=True):
        digest = engine.prompt_digest(ids)
        digests.append(digest + spec.sampling_key)
        for j in range(n):
            out, finish = engine.generate(
                model, digest, spec, max_new, config, fp8=fp8, sample_index=j
            )
            item = Item(rids[len(pairs)], len(ids), out, finish)
            item.kv_dtype = dtype
            item.cached = state.scheduler.note_prefix(config, digest, len(ids))
            pairs.append((item, spec))
    key = hashlib.blake2b(b"".join(digests), digest_size=16).digest()
    return Parsed(pairs, single and n == 1, stream, key)


# --- /generate ------------------------------------------------------------------------------


def _item_json(
    state: SimState,
    item: Item,
    spec: SamplingSpec,
    arrived: float,
    *,
    upto: int | None = None,
    bad_count: bool = False,
) -> dict[str, Any]:
    """One response item; ``upto`` makes it an unfinished streaming chunk."""
    ids, finish = item.result() if upto is None else (item.output_ids[:upto], None)
    meta = {
        "id": item.rid,
        "finish_reason": finish,
        "prompt_tokens": item.prompt_len,
        "completion_tokens": len(ids) + (1 if bad_count else 0),
        "cached_tokens": item.cached,
        "cached_tokens_details": None,
        "weight_version": "default",
        "total_retractions": 0,
        "e2e_latency": asyncio.get_running_loop().time() - arrived,
        "response_sent_to_client_ts": time.time(),
    }
    if state.config.skip_tokenizer_init:
        return {"output_ids": ids, "meta_info": meta}
    trim = finish is not None and finish.get("type") == "stop" and not spec.no_stop_trim
    return {
        "text": state.model.decode(ids[:-1] if trim else ids),
        "output_ids": ids,
        "meta_info": meta,
    }


def _apply_fault_abort(item: Item) -> None:
    item.keep = len(item.output_ids) // 2
    item.abort_finish = abort_reason("Simulated scheduler abort.", 500, "InternalServerError")


def _drop_connection(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.abort()


def _faults(state: SimState, parsed: Parsed) -> frozenset[str]:
    if not state.config.any_fault():
        return frozenset()
    attempt = state.attempts.get(parsed.fault_key, 0)
    if len(state.attempts) >= 1_000_000:
        state.attempts.clear()
    state.attempts[parsed.fault_key] = attempt + 1
    return engine.decide_faults(state.config, parsed.fault_key, attempt)


def _outcome(parsed: Parsed, faults: frozenset[str]) -> str:
    if "abort" in faults:
        return "fault_abort"
    if any(item.abort_finish is not None for item, _ in parsed.pairs):
        return "aborted"
    return "bad_count" if "bad_count" in faults else "ok"


async def generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    loop = asyncio.get_running_loop()
    arrived = loop.time()
    stats, stream = state.scheduler.stats, False
    stats.requests += 1
    try:
        try:
            obj = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise bad_body(f"Invalid JSON body: {exc}") from exc
        stream = isinstance(obj, dict) and bool(obj.get("stream", False))
        parsed = parse_generate(obj, state)
    except SimRequestError as exc:
        stats.outcomes["bad_request"] += 1
        if stream and not exc.plain_http:  # SGLang streams tokenizer errors as an event
            return web.Response(body=_sse(exc.body) + DONE_EVENT, headers=SSE_HEADERS)
        return _json(exc.body, exc.status)
    stats.items += len(parsed.pairs)
    faults = _faults(state, parsed)
    if "stall" in faults:
        stats.outcomes["stall"] += 1
        await asyncio.sleep(state.config.stall_s)
    if "fail_500" in faults:
        stats.outcomes["fail_500"] += 1
        return web.Response(status=500, text="Internal Server Error")
    items = [item for item, _ in parsed.pairs]
    for item in items:
        item.fut = loop.create_future()
    if parsed.stream:
        return await _stream(request, state, parsed, faults, arrived)
    if "fail_503" in faults:
        stats.outcomes["fail_503"] += 1
        return _json({**engine.queue_full_body(), "message": "Simulated overload."}, 503)
    try:
        state.scheduler.submit(items, state.config)
    except QueueFullError:
        stats.outcomes["queue_full"] += 1
        return _json(engine.queue_full_body(), 503)
    try:
        for item in items:
            if item.fut is not None and not item.fut.done():
                await item.fut
    except asyncio.CancelledError:
        stats.outcomes["client_disconnect"] += 1
        state.scheduler.drop(items, state.config)
        raise
    if "reset" in faults:
        stats.outcomes["reset"] += 1
        _drop_connection(request)
        return web.Response()
    if "abort" in faults:
        for item in items:
            _apply_fault_abort(item)
    stats.outcomes[_outcome(parsed, faults)] += 1
    bad = "bad_count" in faults
    out = [_item_json(state, it, spec, arrived, bad_count=bad) for it, spec in parsed.pairs]
    return _json(out[0] if parsed.single else out)


async def _stream(
    request: web.Request,
    state: SimState,
    parsed: Parsed,
    faults: frozenset[str],
    arrived: float,
) -> web.StreamResponse:
    """Cumulative SSE chunks paced over each item's run time, then ``data: [DONE]``."""
    loop = asyncio.get_running_loop()
    items = [item for item, _ in parsed.pairs]
    outcomes = state.scheduler.stats.outcomes
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)

    def event(index: int, body: dict[str, Any]) -> bytes:
        return _sse(body if parsed.single else {**body, "index": index})

    try:
        try:
            if "fail_503" in faults:
                raise QueueFullError("Simulated overload.")
            state.scheduler.submit(items, state.config)
        except QueueFullError as exc:  # SGLang streams a 503 abort as a final abort chunk
            outcomes["fail_503" if "fail_503" in faults else "queue_full"] += 1
            for index, (item, spec) in enumerate(parsed.pairs):
                item.abort_finish = abort_reason(str(exc), 503, None)
                await response.write(event(index, _item_json(state, item, spec, arrived)))
            await response.write(DONE_EVENT)
            return response
        broken = faults & {"stream_error", "reset"}
        for index, (item, spec) in enumerate(parsed.pairs):
            if item.state == QUEUED:
                item.admit_fut = loop.create_future()
                await item.admit_fut
            total = len(item.output_ids)
            for mark in range(spec.stream_interval, total, spec.stream_interval):
                if item.state == ABORTED or (broken and 2 * mark >= total):
                    break
                delay = item.admitted_at + item.duration * mark / total - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if item.state != ABORTED:
                    chunk = _item_json(state, item, spec, arrived, upto=mark)
                    await response.write(event(index, chunk))
            if broken:
                state.scheduler.drop(items, state.config)
                if "reset" in faults:
                    outcomes["reset"] += 1
                    _drop_connection(request)
                    return response
                outcomes["stream_error"] += 1
                error = _sse({"error": {"message": "Simulated mid-stream error."}})
                await response.write(error + DONE_EVENT)
                return response
            if item.fut is not None and not item.fut.done():
                await item.fut
            if "abort" in faults:
                _apply_fault_abort(item)
            bad = "bad_count" in faults
            await response.write(
                event(index, _item_json(state, item, spec, arrived, bad_count=bad))
            )
        outcomes[_outcome(parsed, faults)] += 1
        await response.write(DONE_EVENT)
    except asyncio.CancelledError:
        outcomes["client_disconnect"] += 1
        state.scheduler.drop(items, state.config)
        raise
    except ConnectionError:
        outcomes["client_disconnect"] += 1
        state.scheduler.drop(items, state.config)
    return response


# --- other routes ---------------------------------------------------------------------------


def _ready(state: SimState) -> bool:
    elapsed = asyncio.get_running_loop().time() - state.started
    return state.config.healthy and elapsed >= state.config.startup_s


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _ready(request.app[STATE]) else 503)


async def get_server_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    throughput = state.scheduler.gen_throughput()
    return _json(server_info(state.config, host=state.host, port=state.port, throughput=throughput))


async def get_model_info(request: web.Request) -> web.Response:
    return _json(model_info(request.app[STATE].config))


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = state.config.served_name()
    model = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": state.config.context_length,
    }
    return _json({"object": "list", "data": [model]})


async def get_load(request: web.Request) -> web.Response:
    state = request.app[STATE]
    load = state.scheduler.load(state.config)
    return _json([{**entry, "ts_tic": time.time()} for entry in load])


async def flush_cache(request: web.Request) -> web.Response:
    scheduler = request.app[STATE].scheduler
    if scheduler.live:
        return web.Response(status=400, text="Cache not flushed: requests are running or queued.")
    scheduler.prefix_seen.clear()
    return web.Response(text="Cache flushed.")


async def abort_request(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return _json(bad_body("The request body must be a JSON object.").body, 400)
    rid, abort_all = str(body.get("rid") or ""), bool(body.get("abort_all", False))
    state.scheduler.abort(rid, abort_all, state.config)
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not state.config.enable_metrics:
        raise web.HTTPNotFound()
    text = _render_metrics(state)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


GAUGES = (
    ("num_running_reqs", "The number of running requests."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("cache_hit_rate", "The prefix cache hit rate."),
    ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("num_retracted_reqs", "The number of retracted requests."),
)
COUNTERS = (
    ("prompt_tokens_total", "prompt_tokens"),
    ("generation_tokens_total", "generated_tokens"),
    ("cached_tokens_total", "cached_tokens"),
    ("num_requests_total", "items"),
    ("num_aborted_requests_total", "aborted_items"),
)


def _render_metrics(state: SimState) -> str:
    """Prometheus text in SGLang's names: scheduler gauges per DP rank, tokenizer counters."""
    config, scheduler = state.config, state.scheduler
    stats, pool = scheduler.stats, config.max_total_num_tokens
    hit_rate = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    throughput = scheduler.gen_throughput() / config.dp_size
    name = f'model_name="{config.served_name()}"'
    rows = []
    for load in scheduler.load(config):
        dp = f',dp_rank="{load["dp_rank"]}"' if config.dp_size > 1 else ""
        labels = f'{name},engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"{dp}'
        running = load["num_reqs"] - load["num_waiting_reqs"]
        used = load["num_tokens"]
        waiting = load["num_waiting_reqs"]
        values = (running, waiting, used, used / pool, throughput, hit_rate, pool, 0)
        rows.append((labels, values))
    lines = []
    for index, (metric, help_text) in enumerate(GAUGES):
        lines += [f"# HELP sglang:{metric} {help_text}", f"# TYPE sglang:{metric} gauge"]
        lines += [f"sglang:{metric}{{{labels}}} {float(v[index])}" for labels, v in rows]
    for metric, attr in COUNTERS:
        lines += [f"# HELP sglang:{metric} {metric}.", f"# TYPE sglang:{metric} counter"]
        lines.append(f"sglang:{metric}{{{name}}} {float(getattr(stats, attr))}")
    return "\n".join(lines) + "\n"


def apply_control(state: SimState, changes: dict[str, Any]) -> dict[str, Any]:
    """Validate and install new settings; raises ValidationError or EagledataError."""
    config = SimConfig.model_validate({**state.config.model_dump(), **changes})
    state.model = resolve_model(config)
    state.config = config
    for rank in state.scheduler.ranks:
        state.scheduler.drain(rank, config)
    return config.model_dump()


async def control(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        changes = orjson.loads(await request.read())
        if not isinstance(changes, dict):
            raise ValueError("the body must be a JSON object of SimConfig fields")
        return _json(apply_control(state, changes))
    except (ValueError, ValidationError, EagledataError) as exc:
        return _json({"error": str(exc)}, 400)


def stats_snapshot(state: SimState) -> dict[str, Any]:
    scheduler = state.scheduler
    running = sum(1 for item in scheduler.live if item.state == RUNNING)
    return {
        **scheduler.stats.as_dict(),
        "in_flight": len(scheduler.live),
        "running": running,
        "queued": len(scheduler.live) - running,
        "load": scheduler.load(state.config),
        "kv_cache_dtype": state.config.kv_cache_dtype,
        "effective_kv_dtype": state.config.effective_kv_dtype(),
    }


async def sim_stats(request: web.Request) -> web.Response:
    return _json(stats_snapshot(request.app[STATE]))


def create_app(config: SimConfig) -> web.Application:
    """The simulated server as an aiohttp app; the startup window starts when it starts."""
    app = web.Application(client_max_size=1 << 30)
    app[STATE] = SimState(config=config, model=resolve_model(config))

    async def on_startup(app: web.Application) -> None:
        app[STATE].started = asyncio.get_running_loop().time()

    app.on_startup.append(on_startup)
    router = app.router
    for path in ("/health", "/health_generate"):
        router.add_get(path, health)
    for path in ("/get_server_info", "/server_info"):
        router.add_get(path, get_server_info)
    for path in ("/get_model_info", "/model_info"):
        router.add_get(path, get_model_info)
    router.add_get("/v1/models", list_models)
    router.add_post("/generate", generate)
    router.add_put("/generate", generate)
    router.add_post("/abort_request", abort_request)
    router.add_get("/flush_cache", flush_cache)
    router.add_post("/flush_cache", flush_cache)
    router.add_get("/get_load", get_load)
    router.add_get("/metrics", metrics)
    router.add_post("/_sim/control", control)
    router.add_get("/_sim/stats", sim_stats)
    return app
