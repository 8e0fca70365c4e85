"""The report rendered in a real browser (issue 10): headless Chromium loads the file from disk
with the network off; every image loads, the console stays clean, nothing is fetched, and the
page fits a laptop's width. The screenshot is kept (pytest's tmp dir and ``test-artifacts/``).

Skipped when Chromium is not installed, except under ``CI=true``, where it must run
(``.ci/run`` installs Debian's ``chromium``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
from pathlib import Path

import pytest

from cdp import VIEWPORT, PageCheck, chromium, find_chromium
from conftest import REPO, SAMPLES, make_config, sim_config
from eagledata.report import build_report
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread
from report_fixtures import spread_in_time, write_canary, write_telemetry

pytestmark = pytest.mark.slow  # a real browser

ARTIFACTS = REPO / "test-artifacts"

CONTROL = """<!DOCTYPE html><html><body>
<img alt="broken" src="data:image/png;base64,iVBORw0KGgo=">
<script>console.error("control: an error the checks must see")</script>
</body></html>"""


@pytest.fixture(scope="module")
def executable() -> str:
    found = find_chromium()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the browser test: install Debian's chromium (see .ci/run)")
        pytest.skip("no chromium on this machine: apt-get install chromium to run this test")
    return found


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def load(executable: str, *urls: str) -> list[PageCheck]:
    async with asyncio.timeout(120), chromium(executable) as browser:
        return [await browser.open_page(url) for url in urls]


def test_the_report_renders_in_chromium_offline(
    executable: str, tokenizer_dir: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.01)) as server:
        config = make_config([server.url], run, generation={"max_new_tokens": 48})
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    # a minute of generation: a run of a second is too short to rate, and draws no rate plot
    start = spread_in_time(run, step_s=1.0, latency_s=4.0)
    write_canary(run, start)
    write_telemetry(run, start)
    report = build_report(run)
    control = tmp_path / "control.html"
    control.write_text(CONTROL)

    page, broken = asyncio.run(load(executable, report.resolve().as_uri(), control.as_uri()))

    shot = tmp_path / "report.png"
    shot.write_bytes(page.screenshot)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report-chromium.png")

    # Every plot is drawn (this run has records, failures none, canary and telemetry) and loaded.
    assert len(page.images) == 6, page.images
    assert page.broken_images == []
    assert all(image["complete"] and image["naturalHeight"] > 0 for image in page.images)
    assert page.console_errors == []
    assert page.requests == []  # nothing but the file itself: it can be mailed
    assert page.width <= VIEWPORT[0]  # no sideways scrolling on a laptop
    assert png_size(page.screenshot) == (VIEWPORT[0], page.height) and page.height > 2000

    # The same checks see a broken image and a console error when there is one.
    assert [image["alt"] for image in broken.broken_images] == ["broken"]
    assert broken.console_errors == ["control: an error the checks must see"]
