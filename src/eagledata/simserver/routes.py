"""The simulated server's routes besides ``/generate`` (``app.py``): health, server and model
info, the load signals (``/get_load``, ``/v1/loads``, ``/metrics``), ``/flush_cache``,
``/abort_request``, and the simulator's own ``/_sim/control`` and ``/_sim/stats``.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web
from pydantic import ValidationError

from eagledata.errors import EagledataError
from eagledata.simserver import shapes
from eagledata.simserver.metrics import render_loads, render_metrics
from eagledata.simserver.protocol import (
    bad_body,
    json_response,
)
from eagledata.simserver.scheduler import RID_LIMIT
from eagledata.simserver.server_info import model_info, server_info
from eagledata.simserver.state import STATE, SimState, apply_control, stats_snapshot


def _ready(state: SimState) -> bool:
    elapsed = asyncio.get_running_loop().time() - state.started
    return state.config.healthy and elapsed >= state.config.startup_s


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _ready(request.app[STATE]) else 503)


async def get_server_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    throughput = state.scheduler.gen_throughput()
    tally = state.spec_tally
    return json_response(
        server_info(
            state.config,
            host=state.host,
            port=state.port,
            throughput=throughput,
            spec_tokens=tally.tokens,
            spec_verify_ct=tally.verify_ct,
        )
    )


async def get_model_info(request: web.Request) -> web.Response:
    return json_response(model_info(request.app[STATE].config))


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
    return json_response({"object": "list", "data": [model]})


async def get_load(request: web.Request) -> web.Response:
    state = request.app[STATE]
    config = state.config
    if config.version_tuple() >= (0, 5, 21) or config.hide_load_routes or config.metrics_only:
        raise web.HTTPNotFound()
    load = state.scheduler.load(state.config)
    return json_response([{**entry, "ts_tic": time.time()} for entry in load])


async def flush_cache(request: web.Request) -> web.Response:
    scheduler = request.app[STATE].scheduler
    if scheduler.live:
        return web.Response(status=400, text="Cache not flushed: requests are running or queued.")
    scheduler.prefix_seen.clear()
    for cache in request.app[STATE].prefix_caches.values():
        cache.clear()
    return web.Response(text="Cache flushed.")


async def abort_request(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return json_response(bad_body("The request body must be a JSON object.").body, 400)
    rid, abort_all = str(body.get("rid") or ""), bool(body.get("abort_all", False))
    calls = state.scheduler.stats.abort_calls
    if len(calls) < RID_LIMIT:
        calls.append(rid)
    state.scheduler.abort(rid, abort_all, state.config)
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not state.config.enable_metrics or state.config.hide_load_routes:
        raise web.HTTPNotFound()
    text = render_metrics(state)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def v1_loads(request: web.Request) -> web.Response:
    """``/v1/loads`` (0.5.8+): live load per DP rank (``entrypoints/v1_loads.py``)."""
    state = request.app[STATE]
    config = state.config
    if config.version_tuple() < (0, 5, 8) or config.hide_load_routes or config.metrics_only:
        raise web.HTTPNotFound()
    try:
        body = render_loads(state, request.query.get("dp_rank"), request.query.get("include"))
    except shapes.BadSections as exc:
        return json_response({"detail": str(exc)}, 400)
    return json_response(body)


async def control(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        changes = orjson.loads(await request.read())
        if not isinstance(changes, dict):
            raise ValueError("the body must be a JSON object of SimConfig fields")
        return json_response(apply_control(state, changes))
    except (ValueError, ValidationError, EagledataError) as exc:
        return json_response({"error": str(exc)}, 400)


async def sim_stats(request: web.Request) -> web.Response:
    return json_response(stats_snapshot(request.app[STATE]))
