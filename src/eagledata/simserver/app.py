"""The aiohttp application: SGLang's native routes, plus ``/_sim/control`` and ``/_sim/stats``.

This module owns ``/generate`` (plain and streamed), the ``--api-key`` middleware and the route
table (``create_app``); the other routes are ``routes.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from eagledata.simserver import shapes
from eagledata.simserver.config import SimConfig
from eagledata.simserver.faults import apply_fault_abort, draw_faults
from eagledata.simserver.logprobs import trim_to_output
from eagledata.simserver.model import resolve_model
from eagledata.simserver.protocol import (
    SimRequestError,
    abort_reason,
    bad_body,
    json_response,
    queue_full_body,
)
from eagledata.simserver.requests import (
    Parsed,
    parse_generate,
    remember_answers,
    remember_prompts,
)
from eagledata.simserver.routes import (
    abort_request,
    control,
    flush_cache,
    get_load,
    get_model_info,
    get_server_info,
    health,
    list_models,
    metrics,
    sim_stats,
    v1_loads,
)
from eagledata.simserver.sampling import SamplingSpec
from eagledata.simserver.scheduler import ABORTED, QUEUED, Item, QueueFullError
from eagledata.simserver.state import STATE, SimState

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _sse(body: Any) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


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
    e2e, now = asyncio.get_running_loop().time() - arrived, time.time()
    meta = {
        "id": item.rid,
        "finish_reason": finish,
        "prompt_tokens": item.prompt_len,
        "completion_tokens": len(ids) + (1 if bad_count else 0),
        "cached_tokens": item.cached,
        "cached_tokens_details": shapes.cached_details(state.config, item.cached),
        "weight_version": "default",
        **shapes.retraction_meta(state.config, item.retractions, item.dp_rank),
        "e2e_latency": e2e,
        "response_sent_to_client_ts": now,
    }
    if finish is not None:
        meta.update(shapes.timing_meta(state.config, arrived_wall=now - e2e, now_wall=now,
                                       output_len=len(ids)))  # fmt: skip
    if finish is not None:  # SGLang adds spec_* to the final chunk only
        meta.update(state.spec_tally.finish(state.config.speculative, item.rid, len(ids)))
    if state.config.skip_tokenizer_init:
        return {"output_ids": ids, "meta_info": meta}
    trim = finish is not None and finish.get("type") == "stop" and not spec.no_stop_trim
    return {
        "text": state.model.decode(ids[:-1] if trim else ids),
        "output_ids": ids,
        "meta_info": meta,
    }


def _drop_connection(request: web.BaseRequest) -> None:
    if request.transport is not None:
        request.transport.abort()


def _client_gone(state: SimState, items: list[Item]) -> None:
    """The client left before its answer: count it and free the items' KV."""
    state.scheduler.stats.outcomes["client_disconnect"] += 1
    state.scheduler.drop(items, state.config)


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
        return json_response(exc.body, exc.status)
    stats.items += len(parsed.pairs)
    faults = draw_faults(state.config, state.attempts, parsed.fault_key)
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
        return json_response(queue_full_body("Simulated overload."), 503)
    try:
        state.scheduler.submit(items, state.config)
    except QueueFullError:
        stats.outcomes["queue_full"] += 1
        return json_response(queue_full_body(), 503)
    remember_prompts(state, parsed)
    try:
        for item in items:
            if item.fut is not None and not item.fut.done():
                await item.fut
    except asyncio.CancelledError:
        _client_gone(state, items)
        raise
    if any(item.rejected for item in items):  # retracted, then refused by a full queue
        return json_response(queue_full_body(), 503)
    if "reset" in faults:
        stats.outcomes["reset"] += 1
        _drop_connection(request)
        return web.Response()
    if "abort" in faults:
        for item in items:
            apply_fault_abort(item)
    remember_answers(state, parsed)
    stats.outcomes[_outcome(parsed, faults)] += 1
    bad = "bad_count" in faults
    out = [_item_json(state, it, spec, arrived, bad_count=bad) for it, spec in parsed.pairs]
    for body, extra in zip(out, parsed.logprob_meta, strict=False):  # logprobs.py
        if extra is not None:
            body["meta_info"].update(trim_to_output(extra, len(body["output_ids"])))
            body["meta_info"].update(shapes.logprob_counts(state.config, body["meta_info"]))
    return json_response(out[0] if parsed.single else out)


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
        remember_prompts(state, parsed)
        broken = faults & {"stream_error", "reset"}
        for index, (item, spec) in enumerate(parsed.pairs):
            if item.state == QUEUED:
                item.admit_fut = loop.create_future()
                await item.admit_fut
            total = len(item.output_ids)
            for mark in range(spec.stream_interval, total, spec.stream_interval):
                if item.state == ABORTED or (broken and 2 * mark >= total):
                    break
                if state.config.steps_engine:
                    await state.scheduler.engine(state.config).until_generated(item, mark)
                else:
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
                apply_fault_abort(item)
            bad = "bad_count" in faults
            await response.write(
                event(index, _item_json(state, item, spec, arrived, bad_count=bad))
            )
        remember_answers(state, parsed)
        outcomes[_outcome(parsed, faults)] += 1
        await response.write(DONE_EVENT)
    except asyncio.CancelledError:
        _client_gone(state, items)
        raise
    except ConnectionError:
        _client_gone(state, items)
    return response


OPEN_PATHS = ("/health", "/metrics", "/_sim/")
"""SGLang's ``--api-key`` middleware lets ``/health*`` and ``/metrics`` through; ``/_sim/`` is
the simulator's own control surface, not part of SGLang."""


@web.middleware
async def api_key_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """SGLang's ``--api-key``: 401 ``{"error": "Unauthorized"}`` without the bearer key."""
    key = request.app[STATE].config.api_key
    if key is None or request.method == "OPTIONS" or request.path.startswith(OPEN_PATHS):
        return await handler(request)
    if request.headers.get("Authorization") != "Bearer " + key:
        return json_response({"error": "Unauthorized"}, 401)
    return await handler(request)


def create_app(config: SimConfig) -> web.Application:
    """The simulated server as an aiohttp app; the startup window starts when it starts."""
    app = web.Application(client_max_size=1 << 30, middlewares=[api_key_middleware])
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
    router.add_get("/v1/loads", v1_loads)
    router.add_get("/metrics", metrics)
    router.add_post("/_sim/control", control)
    router.add_get("/_sim/stats", sim_stats)
    return app
