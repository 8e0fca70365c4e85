"""Build hook: ship the checkout's ``configs/`` and launch script inside the package.

The top-level ``configs/`` (the reference config, the demo config, the launch profiles) and
``scripts/launch_sglang.sh`` stay the one copy anyone edits. At build time they are copied into
``eagledata/_shipped/`` of the wheel, where ``eagledata.config.shipped_path`` finds them with
``importlib.resources``, so an installed eagledata works from any directory. A checkout (an
editable install) reads the same files in place instead. What ships is listed once, in
``MANIFEST.in``: the sdist reads it, and so does this hook.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def shipped_files() -> list[Path]:
    """The files ``MANIFEST.in`` names (its ``include`` and ``recursive-include`` lines): the one
    list of what ships, read by the sdist and here for the wheel."""
    files: set[Path] = set()
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "include":
            files.update(path for word in words[1:] for path in ROOT.glob(word))
        elif words[0] == "recursive-include":
            folder, patterns = words[1], words[2:]
            files.update(path for p in patterns for path in (ROOT / folder).rglob(p))
        else:
            raise SystemExit(f"MANIFEST.in: setup.py does not read {words[0]!r} lines")
    return sorted(path for path in files if path.is_file())


class BuildPyShippingConfigs(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's own files
            return
        target_root = Path(self.build_lib) / "eagledata" / "_shipped"
        for source in shipped_files():
            target = target_root / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            if os.access(source, os.X_OK):
                target.chmod(0o755)


setup(cmdclass={"build_py": BuildPyShippingConfigs})
