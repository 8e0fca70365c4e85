"""Build hook: ship the checkout's ``configs/`` and launch script inside the package.

The top-level ``configs/`` (the reference config, the demo config, the launch profiles) and
``scripts/launch_sglang.sh`` stay the one copy anyone edits. At build time they are copied into
``eagledata/_shipped/`` of the wheel, where ``eagledata.config.shipped_path`` finds them with
``importlib.resources``, so an installed eagledata works from any directory. A checkout (an
editable install) reads the same files in place instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# (source relative to the checkout, patterns to ship); keep in step with MANIFEST.in
SHIPPED = (
    ("configs", ("*.toml", "profiles/*.toml", "sglang-releases/*.toml")),
    ("scripts", ("launch_sglang.sh",)),
)


class BuildPyShippingConfigs(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's own files
            return
        target_root = Path(self.build_lib) / "eagledata" / "_shipped"
        for folder, patterns in SHIPPED:
            for pattern in patterns:
                for source in sorted((ROOT / folder).glob(pattern)):
                    target = target_root / source.relative_to(ROOT)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)
                    if os.access(source, os.X_OK):
                        target.chmod(0o755)


setup(cmdclass={"build_py": BuildPyShippingConfigs})
