"""The two JSON files of a run directory, as types: ``run.json`` (``Manifest``: what a run froze
when it started) and ``plan.json`` (``PlanFile``: the plan's size once its datasets were read to
their end). ``RunDir.manifest()`` and ``RunDir.plan_file()`` (``rundir/manifest.py``) are the one
way to read them; nothing reads either by string keys.

Both are read leniently where an earlier eagledata wrote less (a run from before the canary has
no ``canary``; one from before mixes no ``datasets``), and strictly in type: a value of the wrong
type is a one-line ``RunDirError`` naming the key. Unknown keys are kept (``extra="allow"``): a
later eagledata may add to ``run.json`` without this one refusing it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class CanaryChoice(BaseModel):
    """``--no-canary`` or not: chosen when a run starts, kept for its life."""

    model_config = ConfigDict(frozen=True)

    enabled: bool


class Manifest(BaseModel):
    """``run.json``. ``frozen`` and ``config`` stay the JSON they were written as: they are
    validated by this release where they are used (``RunDir.frozen()``, ``resume``), so that a
    setting this release refuses is named with its fix, not as a parse error of ``run.json``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    schema_version: int
    fingerprint: str = ""
    """The frozen settings' fingerprint, stamped on every record and failure line."""
    frozen: dict[str, Any] = {}
    created_at: float | None = None
    versions: dict[str, Any] = {}
    line_schemas: dict[str, Any] = {}
    config: dict[str, Any] | None = None
    """The settings the run was started with (``AppConfig`` as JSON): what resume starts from."""
    planned_estimate: int | None = None
    """The plan's size estimated before its datasets were read to their end."""
    canary: CanaryChoice | None = None
    """None for a run from before the canary existed (resume keeps it without one)."""
    server_facts: dict[str, dict[str, Any]] = {}
    """Per server URL, its facts at the first session (``server/serverfacts.py`` as JSON)."""
    row_id_scheme: int = 1
    """How rows without an id are named (``source/dataset.py``): kept for the run's life."""
    datasets: dict[str, Any] | None = None
    """Each dataset's file fingerprint (``source/fingerprint.py``); None for a run started
    before datasets were recorded."""

    @property
    def canary_enabled(self) -> bool:
        return self.canary is not None and self.canary.enabled

    def setting(self, section: str, key: str) -> Any:
        """``config[section][key]`` as started, or None."""
        values = (self.config or {}).get(section)
        return values.get(key) if isinstance(values, dict) else None


class PlanFile(BaseModel):
    """``plan.json``: written once the plan's datasets were read to their end."""

    model_config = ConfigDict(extra="allow", frozen=True)

    planned: int
    datasets: dict[str, int] | None = None
    """Each dataset's planned items (runs since mixes and turns existed)."""
