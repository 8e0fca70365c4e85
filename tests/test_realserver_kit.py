"""The real-server tier's kit itself, without SGLang: when the tier skips, when it fails instead,
and that a server's whole process group is gone after ``stop``."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import realserver
from realserver import env


def unreachable(*args: object, **kwargs: object) -> Path:
    raise env.RegistryUnreachable("cannot reach the package registry to install the pins")


def test_no_registry_skips_the_tier_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "ensure_venv", unreachable)
    monkeypatch.delenv(realserver.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        realserver.venv_or_skip()
    assert str(skipped.value).count("\n") == 0
    assert "real SGLang tier skipped: cannot reach the package registry" in str(skipped.value)


def test_where_the_tier_is_required_no_registry_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "ensure_venv", unreachable)
    monkeypatch.setenv(realserver.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="the real-server tier is required here"):
        realserver.venv_or_skip()


def test_ci_requires_the_tier() -> None:
    ci = (realserver.REPO / ".ci" / "run").read_text()
    assert f"{realserver.REQUIRE_ENV}=1 pytest" in ci


# A stand-in server: answers /health, and has a child that ignores SIGTERM (as a wedged
# scheduler process would).
STUBBORN = textwrap.dedent(
    """
    import http.server, signal, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open("child.pid", "w").write(str(child.pid))
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
    """
)


@pytest.mark.slow
def test_stop_ends_the_whole_process_group_within_its_bound(tmp_path: Path) -> None:
    server = env.Server(tmp_path / "model", tmp_path / "work")
    server.argv = [sys.executable, "-c", STUBBORN, str(server.port)]
    server.start(ready_timeout=60)
    assert server.ready_seconds is not None and server.process is not None
    child = int((tmp_path / "work" / "child.pid").read_text())
    group = server.process.pid
    server.stop(timeout=2)
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_a_server_that_dies_before_ready_says_why(tmp_path: Path) -> None:
    server = env.Server(tmp_path / "model", tmp_path / "work")
    server.argv = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    with pytest.raises(env.SetupError, match="exited with 3 before it was ready") as error:
        server.start(ready_timeout=60)
    assert "no model here" in str(error.value)
    assert server.stop() == 3  # already gone: nothing left to end
