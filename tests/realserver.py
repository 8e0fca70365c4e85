"""The real-server tier's kit: the real SGLang 0.5.23 on this CPU, its model, its request log.

The venv and the server process are ``scripts/sglang_cpu_env.py``'s (stdlib only, so the shape
recorder uses it too); this module adds what the tests need around them:

* ``sglang_cpu_venv`` (session): the venv, built the first time (minutes, docs/sglang.md). When
  the package registry cannot be reached the tier skips with one line, unless
  ``EAGLEDATA_REQUIRE_REAL_SGLANG=1`` (``.ci/run`` sets it) turns that skip into a failure;
* ``real_model_dir`` (session): the model every real server serves: the repo's trained small
  Llama when present, a random-weight one otherwise, ``EAGLEDATA_REAL_MODEL`` to choose another;
* :func:`serve`: a server started in a process group of its own and stopped, children included,
  within a bound; modules share one through a module-scoped fixture of their own (a start is
  ~30 s);
* :class:`RequestLog`: the server's own request log (``request.received`` /
  ``request.finished`` by rid), the ground truth of what it was asked and answered.

Tests of the tier carry the ``realserver`` marker (``pytest -m realserver`` runs only them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "src" / "eagledata" / "assets" / "tokenizer" / "tiny-chatml"
TRAINED_MODEL = REPO / "src" / "eagledata" / "assets" / "model" / "tiny-llama-chatml"
REQUIRE_ENV = "EAGLEDATA_REQUIRE_REAL_SGLANG"
MODEL_ENV = "EAGLEDATA_REAL_MODEL"


def load_script(name: str) -> Any:
    """``scripts/<name>.py`` as a module (the scripts folder is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


env = load_script("sglang_cpu_env")


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


@pytest.fixture(scope="session")
def sglang_cpu_venv() -> Path:
    return venv_or_skip()


def venv_or_skip() -> Path:
    """The venv; a skip of one line when the registry cannot be reached, a failure instead
    where the tier is required."""
    try:
        venv: Path = env.ensure_venv(log=lambda line: print(line, file=sys.stderr))
    except env.RegistryUnreachable as error:
        if required():
            pytest.fail(f"{error}; the real-server tier is required here ({REQUIRE_ENV}=1)")
        pytest.skip(f"real SGLang tier skipped: {error}")
    except env.SetupError as error:
        pytest.fail(str(error))
    return venv


@pytest.fixture(scope="session")
def real_model_dir(sglang_cpu_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model the real servers serve: ``EAGLEDATA_REAL_MODEL`` (a model folder) when set, else
    the repo's small trained Llama when it is there (``TRAINED_MODEL``), else a tiny Llama with
    random weights and the bundled ChatML tokenizer, built here."""
    chosen = os.environ.get(MODEL_ENV) or (TRAINED_MODEL if TRAINED_MODEL.is_dir() else None)
    if chosen:
        if not (Path(chosen) / "config.json").is_file():
            pytest.fail(f"{chosen} holds no config.json: not a model folder")
        return Path(chosen)
    out = tmp_path_factory.mktemp("real-model") / "random-llama"
    try:
        return Path(env.build_random_model(TOKENIZER_DIR, out, sglang_cpu_venv))
    except env.SetupError as error:
        pytest.fail(str(error))


@contextmanager
def serve(
    venv: Path,
    model_dir: Path,
    workdir: Path,
    *,
    kv_cache_dtype: str = "bf16",
    max_total_tokens: int = 4096,
    extra_flags: tuple[str, ...] = (),
) -> Iterator[Any]:
    """A real server, ready; stopped (the whole process group, bounded) on exit."""
    server = env.Server(
        model_dir, workdir, kv_cache_dtype=kv_cache_dtype, max_total_tokens=max_total_tokens,
        extra_flags=extra_flags, venv=venv,
    )  # fmt: skip
    try:
        server.start()
    except env.SetupError as error:
        server.stop()
        pytest.fail(str(error))
    try:
        yield server
    finally:
        server.stop()


@dataclass
class RequestLog:
    """The server's request log (``--log-requests-format json``): one event per line, after a
    ``[date time]`` prefix. The server's own warm-up request comes first (text, no input_ids)."""

    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> RequestLog:
        events = []
        for path in sorted(folder.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                start = line.find("{")
                if start < 0:
                    continue
                try:
                    events.append(json.loads(line[start:]))
                except json.JSONDecodeError:
                    continue  # a line the server was still writing
        return cls(events)

    def by_rid(self, event: str) -> dict[str, dict[str, Any]]:
        return {item["rid"]: item for item in self.events if item.get("event") == event}

    def received(self) -> dict[str, dict[str, Any]]:
        return self.by_rid("request.received")

    def finished(self) -> dict[str, dict[str, Any]]:
        return self.by_rid("request.finished")
