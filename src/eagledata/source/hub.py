"""Hub names without a network: a dataset or tokenizer named by its hub id is read from the local
cache when the hub cannot be reached, and one the cache does not hold fails in one line within
seconds. Without this the hub client retried for 28-48 s (five backoffs per file) before the same
answer.

``HF_HUB_OFFLINE`` (or ``HF_DATASETS_OFFLINE``) set: nothing is probed, the libraries read the
cache. Otherwise one HEAD of the hub's endpoint (``HF_ENDPOINT``), through the environment's proxy,
with a ``HUB_PROBE_S`` timeout, once per process.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

HUB_PROBE_S = 3.0
"""How long the hub gets to answer one HEAD before it is taken as unreachable."""

TRUE = {"1", "ON", "YES", "TRUE"}


def offline_by_env() -> bool:
    return any(
        os.environ.get(name, "").upper() in TRUE
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


OFFLINE_BY_USER = offline_by_env()
"""Read at import: ``go_offline`` sets the same variables later, for the libraries."""


@cache
def hub_reachable() -> bool:
    """Whether the hub's endpoint answers at all (any HTTP status) within ``HUB_PROBE_S``."""
    import httpx
    from huggingface_hub import constants

    try:
        httpx.head(constants.ENDPOINT, timeout=HUB_PROBE_S, follow_redirects=False)
    except httpx.HTTPError:
        return False
    return True


def cache_folder(repo_id: str, repo_type: str) -> Path:
    """Where ``huggingface_hub`` keeps ``repo_id`` (``models--org--name``, ``datasets--...``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}"


def go_offline() -> None:
    """From now on the libraries read the cache only (they read the flag at each call)."""
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets.config
    except ImportError:  # pragma: no cover - datasets is a dependency
        return
    datasets.config.HF_HUB_OFFLINE = True


def unreachable_and_uncached(repo_id: str, repo_type: str) -> str | None:
    """Before reading ``repo_id`` from the hub: None when it may be read (the hub answers, or
    offline mode is set, or the cache holds it: then offline mode is switched on), else why
    not, with the fix."""
    if OFFLINE_BY_USER or hub_reachable():
        return None
    folder = cache_folder(repo_id, repo_type)
    if (folder / "snapshots").is_dir():
        go_offline()
        return None
    from huggingface_hub import constants

    return (
        f"{constants.ENDPOINT} cannot be reached (no answer within {HUB_PROBE_S:g} s) and the "
        f"local cache has no {folder.name}; connect to the network, copy a cache that holds it "
        "(HF_HOME), or pass a local file or directory"
    )
