"""Which SGLang release ``launch-server`` renders a profile for: ``--sglang-version``, else the
one installed for ``$SGLANG_PYTHON`` (read from its metadata, nothing imported), else (a dry
run) the newest the profile runs on."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from eagledata.errors import ConfigError, LaunchError
from eagledata.profiles.profile import Profile

_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    pass\n"
)


def sglang_python(env: Mapping[str, str] | None = None) -> str:
    """The interpreter ``scripts/launch_sglang.sh`` runs SGLang with (``SGLANG_PYTHON``)."""
    return (os.environ if env is None else env).get("SGLANG_PYTHON") or "python"


def installed_sglang_version(python: str, *, timeout_s: float = 60.0) -> str | None:
    """The sglang version ``python`` has installed (read from its metadata, nothing imported);
    None when it has none, or ``python`` cannot be run."""
    try:
        done = subprocess.run(
            [python, "-c", _VERSION_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip().splitlines()
    return found[-1].strip() if done.returncode == 0 and found else None


def choose_version(
    profile: Profile,
    *,
    requested: str | None,
    installed: str | None,
    python: str,
    dry_run: bool,
) -> tuple[str, str]:
    """The release whose form of ``profile`` is rendered, and a note for stderr.

    ``--sglang-version`` (``requested``) wins; else the installed release; a dry run on a
    machine without SGLang shows the newest release the profile runs on. A release the profile
    has no form for is one ``ConfigError`` line naming those it has."""
    if requested is not None:
        profile.release(requested)
        note = f"sglang {requested} form"
        if installed is not None and installed != requested:
            note += f" (sglang {installed} is installed)"
        return requested, note
    if installed is not None:
        if installed not in profile.sglang_versions:
            try:
                profile.release(installed)
            except ConfigError as error:
                raise ConfigError(
                    f"{error} (sglang {installed} is installed for {python}). Fix: install one "
                    "of those, or pass --sglang-version V to launch V's form anyway"
                ) from None
        return installed, f"sglang {installed} (installed for {python})"
    if dry_run:
        newest = profile.newest_version
        return newest, (
            f"no sglang installed for {python} (SGLANG_PYTHON): the sglang {newest} form; "
            "--sglang-version V shows another"
        )
    raise LaunchError(
        f"no sglang installed for {python} (SGLANG_PYTHON). Fix: pip install "
        f"sglang=={profile.newest_version} (profile {profile.name} needs SGLang >= "
        f"{profile.min_release})"
    )
