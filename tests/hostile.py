"""A small hostile SGLang server: it speaks ``/health``, ``/server_info`` and ``/generate`` in
SGLang's shapes, passes the KV guard (a bf16 server of the bundled tokenizer's model), answers
honestly (the simulated model's own answer, ``expected_output``) and then misbehaves one way.

``HostileServer(tokenizer_dir, "id_negative")`` breaks the answers of sample 0 of every prompt
and answers sample 1 honestly, so one run shows both sides: every bad answer an item failure,
every honest one a record. ``only_sample=None`` misbehaves on every answer.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import orjson
from aiohttp import web

from eagledata.simserver import SimConfig, expected_output
from eagledata.simserver.model import resolve_model
from eagledata.simserver.server_info import server_info

Answer = dict[str, Any]
Misbehaviour = Callable[["HostileServer", web.Request, Answer], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def _rewrite(answer: Answer, change: Callable[[Answer], None]) -> web.StreamResponse:
    change(answer)
    return _json(answer)


def _ids(change: Callable[[list[int]], list[Any]]) -> Misbehaviour:
    """Replace the answer's ids, its counts kept consistent: only the ids are wrong."""

    async def act(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
        ids = change(answer["output_ids"])
        answer["output_ids"] = ids
        answer["meta_info"]["completion_tokens"] = len(ids)
        return _json(answer)

    return act


def _one(position: int, value: Any) -> Callable[[list[int]], list[Any]]:
    def change(ids: list[int]) -> list[Any]:
        ids = list(ids)
        ids[min(position, len(ids) - 1)] = value
        return ids

    return change


async def _too_many(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
    """~1,000 ids whatever max_new_tokens asked for, counts consistent, finish 'length'."""
    ids = (answer["output_ids"] * 1000)[:1012]
    answer["output_ids"] = ids
    answer["meta_info"]["completion_tokens"] = len(ids)
    answer["meta_info"]["finish_reason"] = {"type": "length", "length": len(ids)}
    return _json(answer)


async def _huge_text(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
    """A 50 MB ``text`` beside honest ids (Content-Length set: it says so up front)."""
    answer["text"] = "A" * (50 * 2**20)
    server.sent_bytes += 50 * 2**20
    return _json(answer)


async def _huge_chunked(
    server: HostileServer, request: web.Request, answer: Answer
) -> web.StreamResponse:
    """The same answer, chunked: no Content-Length, so only a cap while reading stops it."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    head = orjson.dumps(answer)[:-1] + b', "padding": "'
    await response.write(head)
    block = b"A" * 2**20
    try:
        for _ in range(50):
            await response.write(block)
            server.sent_bytes += len(block)
        await response.write(b'"}')
    except (ConnectionError, RuntimeError):
        pass  # the client hung up: what a cap should do
    return response


async def _trickle(
    server: HostileServer, request: web.Request, answer: Answer
) -> web.StreamResponse:
    """The honest answer, one byte every ``trickle_s``: every read is quick, the whole is not."""
    return await _drip(server, request, orjson.dumps(answer))


async def _drip(server: HostileServer, request: web.Request, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "application/json", "Content-Length": str(len(body))}
    )
    await response.prepare(request)
    try:
        for index in range(len(body)):
            await response.write(body[index : index + 1])
            server.sent_bytes += 1
            await asyncio.sleep(server.trickle_s)
    except (ConnectionError, RuntimeError):
        pass
    return response


async def _silent(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
    """Never answers (the connection stays open)."""
    await asyncio.sleep(3600)
    return _json(answer)


def _provenance(answer: Answer) -> None:
    """Every field a record keeps, of a JSON type the record cannot hold."""
    meta = answer["meta_info"]
    meta.update(weight_version=7, cached_tokens=True, e2e_latency="fast", spec_verify_ct="x")
    meta["total_retractions"] = -3
    if meta["finish_reason"]["type"] == "stop":
        meta["finish_reason"]["matched"] = True


def _float_counts(answer: Answer) -> None:
    meta = answer["meta_info"]
    meta["prompt_tokens"] = float(meta["prompt_tokens"])
    meta["completion_tokens"] = float(meta["completion_tokens"])


async def _provenance_types(server: HostileServer, request: web.Request, answer: Answer) -> Any:
    return await _rewrite(answer, _provenance)


async def _count_types(server: HostileServer, request: web.Request, answer: Answer) -> Any:
    return await _rewrite(answer, _float_counts)


BOMB_BYTES = 200 << 20
"""What a bomb holds once inflated: far past any cap, small enough for a failing run to
survive."""


@functools.cache
def bomb(encoding: str) -> bytes:
    """``BOMB_BYTES`` of zeros, compressed as ``encoding`` says (``gzip, gzip``: twice): a few
    hundred bytes to 200 kB on the wire."""
    data = b""
    for layer in (part.strip() for part in encoding.split(",")):
        compressor = zlib.compressobj(9, zlib.DEFLATED, 31 if layer == "gzip" else 15)
        if not data:
            block = bytes(1 << 20)
            out = [compressor.compress(block) for _ in range(BOMB_BYTES >> 20)]
        else:
            out = [compressor.compress(data)]
        data = b"".join(out) + compressor.flush()
    return data


def encoded(body: bytes, encoding: str) -> bytes:
    """``body`` compressed as ``encoding`` says, layer after layer."""
    for layer in (part.strip() for part in encoding.split(",")):
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31 if layer == "gzip" else 15)
        body = compressor.compress(body) + compressor.flush()
    return body


HTML = b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head></html>\n"

SPOILS = ("gzip, gzip", "gzip", "deflate", "br", "html", "list", "drip", "slow")
"""How ``HostileServer(spoiled={route: spoil})`` answers a control route: a bomb in that
encoding, a brotli body (not decoded), an HTML page, a JSON list, its honest body dripped one
byte every ``trickle_s``, or its honest body after ``trickle_s``."""


async def spoiled_answer(
    server: HostileServer, request: web.Request, spoil: str, honest: bytes
) -> web.StreamResponse:
    if spoil == "html":
        return web.Response(body=HTML, content_type="text/html")
    if spoil == "list":
        return _json([1, 2, 3])
    if spoil == "br":
        return web.Response(
            body=b"\x1b\xff\xff" * 100,
            headers={"Content-Type": "application/json", "Content-Encoding": "br"},
        )
    if spoil == "drip":
        return await _drip(server, request, honest)
    if spoil == "slow":
        await asyncio.sleep(server.trickle_s)
        return web.Response(body=honest, content_type="application/json")
    return web.Response(
        body=bomb(spoil),
        headers={"Content-Type": "application/json", "Content-Encoding": spoil},
    )


def _bomb(encoding: str) -> Misbehaviour:
    async def act(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
        server.sent_bytes += len(bomb(encoding))
        return await spoiled_answer(server, request, encoding, b"")  # type: ignore[return-value]

    return act


def _encoded_honestly(encoding: str) -> Misbehaviour:
    """The honest answer, compressed: what a proxy between might do; it must still be read."""

    async def act(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
        return web.Response(
            body=encoded(orjson.dumps(answer), encoding),
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )

    return act


async def _html(server: HostileServer, request: web.Request, answer: Answer) -> web.Response:
    return web.Response(body=HTML, content_type="text/html")


MISBEHAVIOURS: dict[str, Misbehaviour] = {
    "bomb_gzip_gzip": _bomb("gzip, gzip"),
    "bomb_gzip": _bomb("gzip"),
    "bomb_deflate": _bomb("deflate"),
    "brotli": _bomb("br"),
    "gzip_gzip_honest": _encoded_honestly("gzip, gzip"),
    "deflate_honest": _encoded_honestly("deflate"),
    "html": _html,
    "id_negative": _ids(_one(0, -1)),
    "id_2_33": _ids(_one(3, 2**33)),
    "ids_shifted": _ids(lambda ids: [token + 10_000_000 for token in ids]),
    "id_string": _ids(_one(1, "12")),
    "id_float": _ids(_one(1, 12.0)),
    "id_bool": _ids(_one(1, True)),
    "id_null": _ids(_one(1, None)),
    "too_many_ids": _too_many,
    "huge_text": _huge_text,
    "huge_chunked": _huge_chunked,
    "trickle": _trickle,
    "silent": _silent,
    "provenance_types": _provenance_types,
    "float_counts": _count_types,
}


class HostileServer:
    """The hostile server on its own event loop in a daemon thread (``with`` starts and stops)."""

    def __init__(
        self,
        tokenizer_dir: str,
        misbehaviour: str | None = None,
        *,
        only_sample: int | None = 0,
        trickle_s: float = 0.2,
        context_length: int = 32768,
        spoiled: dict[str, str] | None = None,
        spoiled_after: int = 0,
        info: dict[str, Any] | None = None,
    ) -> None:
        """``spoiled``: control routes answered badly (``SPOILS``), e.g. ``{"/server_info":
        "html"}``, once ``spoiled_after`` ``/generate`` requests have come (0: from the start);
        ``info``: the ``/server_info`` to answer in place of the simulator's."""
        self.model = SimConfig(tokenizer_path=tokenizer_dir, context_length=context_length)
        self.misbehaviour = misbehaviour
        self.only_sample = only_sample
        self.trickle_s = trickle_s
        self.generate_times: list[float] = []
        """When each /generate request arrived (monotonic)."""
        self.sent_bytes = 0
        self.spoiled = dict(spoiled or {})
        self.spoiled_after = spoiled_after
        self.asked: list[str] = []
        """Every control route asked for, in order."""
        self.info = info
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def honest(self, request_body: dict[str, Any]) -> Answer:
        input_ids = request_body["input_ids"]
        params = request_body.get("sampling_params") or {}
        ids, finish = expected_output(input_ids, params, self.model)
        model = resolve_model(self.model)
        return {
            "text": model.decode([t for t in ids if t != model.eos_token_id]),
            "output_ids": ids,
            "meta_info": {
                "id": request_body.get("rid", "x"),
                "finish_reason": dict(finish),
                "prompt_tokens": len(input_ids),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "e2e_latency": 0.01,
                "weight_version": "default",
            },
        }

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=2**30)

        def honest_info() -> dict[str, Any]:
            if self.info is not None:
                return self.info
            return server_info(self.model, host="127.0.0.1", port=self.port, throughput=0)

        honest_bodies: dict[str, Callable[[], bytes]] = {
            "/health": lambda: b"",
            "/server_info": lambda: orjson.dumps(honest_info()),
            "/get_server_info": lambda: orjson.dumps(honest_info()),
            "/v1/loads": lambda: orjson.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": 0}]}),
            "/metrics": lambda: b"sglang:num_running_reqs 0\n",
            "/get_load": lambda: orjson.dumps([{"num_reqs": 0, "num_waiting_reqs": 0}]),
            "/workers": lambda: orjson.dumps({"workers": []}),
            "/abort_request": lambda: b"{}",
        }

        def control(route: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
            async def answer(request: web.Request) -> web.StreamResponse:
                self.asked.append(route)
                spoil = self.spoiled.get(route)
                if spoil is None or len(self.generate_times) < self.spoiled_after:
                    if route in ("/server_info", "/get_server_info"):
                        return _json(honest_info())
                    if route == "/health":
                        return web.Response(text="")
                    if route == "/abort_request":
                        return _json({})
                    raise web.HTTPNotFound()
                return await spoiled_answer(self, request, spoil, honest_bodies[route]())

            return answer

        async def generate(request: web.Request) -> web.StreamResponse:
            self.generate_times.append(time.monotonic())
            body = orjson.loads(await request.read())
            answer = self.honest(body)
            params = body.get("sampling_params") or {}
            sample = params.get("sampling_seed")
            chosen = self.only_sample is None or sample == self.only_sample
            if self.misbehaviour is None or not chosen or params.get("max_new_tokens") == 1:
                return _json(answer)  # honest (and every one-token probe: the server works)
            return await MISBEHAVIOURS[self.misbehaviour](self, request, answer)

        for route in ("/health", "/server_info", "/get_server_info", "/v1/loads", "/metrics"):
            app.router.add_get(route, control(route))
        for route in ("/get_load", "/workers"):
            app.router.add_get(route, control(route))
        app.router.add_post("/generate", generate)
        app.router.add_post("/abort_request", control("/abort_request"))
        return app

    async def _start(self) -> int:
        self._runner = web.AppRunner(self._app(), handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        return int(sockets[0].getsockname()[1])

    def _serve(self, started: Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            port = loop.run_until_complete(self._start())
        except BaseException as exc:
            started.set_exception(exc)
            loop.close()
            return
        started.set_result(port)
        try:
            loop.run_forever()
        finally:
            assert self._runner is not None
            loop.run_until_complete(self._runner.cleanup())
            left = asyncio.all_tasks(loop)  # handlers still trickling or silent
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=5))
            loop.close()

    def __enter__(self) -> HostileServer:
        started: Future[int] = Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        self.port = started.result(timeout=30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
