"""Make the README's picture of the report from the demo run, so it cannot go stale.

    python scripts/screenshot_report.py            # writes docs/img/report.png

Runs the README's demo (``eagledata generate --config configs/demo.toml --dataset sample``) in a
temporary folder, writes its report, and screenshots it with headless Chromium (Debian's
``chromium``), reduced to 128 colours. Offline: the demo's simulated server and bundled files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "img" / "report.png"
WINDOW = "1100,2600"


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("needs Chromium: apt-get install chromium", file=sys.stderr)
        return 1
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="eagledata-shot-") as work:
        run = Path(work) / "runs" / "demo"  # shown on the page as runs/demo, as in the README
        eagledata = [sys.executable, "-m", "eagledata.cli"]
        subprocess.run(
            [*eagledata, "generate", "--config", str(REPO / "configs" / "demo.toml"),
             "--dataset", "sample", "--out", "runs/demo", "--no-progress"],
            check=True, env=env, cwd=work,
        )  # fmt: skip
        subprocess.run([*eagledata, "report", "runs/demo"], check=True, env=env, cwd=work)
        shot = Path(work) / "report.png"
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={work}/profile", f"--window-size={WINDOW}",
             f"--screenshot={shot}", (run / "report.html").as_uri()],
            check=True, capture_output=True,
        )  # fmt: skip
        with Image.open(shot) as image:
            image.convert("RGB").quantize(colors=128).save(TARGET, optimize=True)
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
