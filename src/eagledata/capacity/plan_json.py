"""``eagledata plan --json``: the same table as one JSON object, for scripts and tests.

Per profile: everything the text table shows, plus ``kv_tokens`` (the server's KV slots),
``speculative`` (null, or its settings and arithmetic) and ``status`` (``measured``,
``arithmetic`` or ``unverified``; the free text is ``status_text``), the ``rig`` it is planned on,
the ``nodes`` one server spans, the ``servers`` the rig holds, and ``starts``. Top level: the
``rig`` (its GPUs and what it assumes), ``best`` (the fastest bf16 row, with and without
speculative decoding, and the rejected fp8 row it is measured against), and ``elsewhere`` (the
profiles written for other rigs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eagledata.capacity.plan_row import PlanRow, best_key, written_for
from eagledata.capacity.workload import Workload
from eagledata.profiles.profile import Profile
from eagledata.profiles.rigs import Rig


def _row(row: PlanRow) -> dict[str, Any]:
    data = row.model_dump(mode="json")
    data["status_text"] = data.pop("status")
    return {
        "profile": row.profile,
        "rig": row.rig,
        "nodes": row.nodes,
        "starts": row.starts,
        "kv_cache_dtype": row.kv_cache_dtype,
        "kv_tokens": row.system_tokens,
        "running": row.running,
        "tok_s": row.tok_s,
        "speculative": data.pop("speculative"),
        "status": row.evidence or "unknown",
        **data,
    }


def _best(rows: Sequence[PlanRow], keep: Any) -> str | None:
    chosen = [r for r in rows if r.is_bf16 and r.starts and keep(r)]
    return max(chosen, key=best_key).profile if chosen else None


def plan_document(
    rows: Sequence[PlanRow],
    workload: Workload | None = None,
    *,
    rig: Rig | None = None,
    elsewhere: Sequence[Profile] = (),
) -> dict[str, Any]:
    """One JSON-ready object: the rig, the workload, every row, and the best bf16 rows."""
    rejected = [r for r in rows if not r.is_bf16 and r.starts]
    return {
        "rig": None if rig is None else rig.model_dump(mode="json"),
        "workload": (
            None
            if workload is None
            else {
                **workload.model_dump(mode="json", exclude={"prompt_length_sample"}),
                "total_output_tokens": workload.total_output_tokens,
                "tokens_per_running_request": workload.tokens_per_running_request,
            }
        ),
        "profiles": [_row(row) for row in rows],
        "best": {
            "bf16": _best(rows, lambda r: True),
            "bf16_without_speculative": _best(rows, lambda r: r.speculative is None),
            "bf16_with_speculative": _best(rows, lambda r: r.speculative is not None),
            "rejected": max(rejected, key=lambda r: r.tok_s).profile if rejected else None,
        },
        "elsewhere": {profile.name: written_for(profile) for profile in elsewhere},
    }
