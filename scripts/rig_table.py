"""Write the rigs tables of docs/throughput.md from the plan itself (``eagledata plan --json
--rig NAME`` for every rig of configs/rigs.toml, the reference workload).

The block between ``<!-- rigs: scripts/rig_table.py -->`` and ``<!-- /rigs -->`` is replaced by
two tables: the best bf16 row of each rig against that rig's rejected fp8 row, then every row
of every rig (those that do not start say why in the plan).

    python scripts/rig_table.py           # rewrite the doc
    python scripts/rig_table.py --check   # exit 1 if the doc is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from eagledata.capacity import REFERENCE_WORKLOAD
from eagledata.capacity.plan_row import PlanRow, best_key
from eagledata.capacity.planner import plan_profiles
from eagledata.capacity.planning import profiles_for
from eagledata.profiles.loading import load_profiles
from eagledata.profiles.rigs import Rig, rigs

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "throughput.md"
BLOCK = re.compile(r"(<!-- rigs: scripts/rig_table.py -->\n)(.*?)(<!-- /rigs -->)", re.S)


def _tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n / 1e3:.0f}k"


def _days(row: PlanRow) -> str:
    return "-" if row.wall_clock_hours is None else f"{row.wall_clock_hours / 24:.1f}"


def rig_rows(rig: Rig) -> list[PlanRow]:
    planned, _ = profiles_for(rig, load_profiles(profiles_dir=ROOT / "configs" / "profiles"))
    return plan_profiles(planned, REFERENCE_WORKLOAD, rig=rig)


def _name(row: PlanRow) -> str:
    return f"`{row.profile}`"


def best_table(by_rig: dict[str, list[PlanRow]]) -> list[str]:
    lines = [
        "| rig | best bf16 | tok/s | days | without the drafter | rejected fp8 | tok/s "
        "| bf16 / fp8 | assumptions never run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in by_rig.items():
        bf16 = [r for r in rows if r.is_bf16 and r.starts]
        fp8 = [r for r in rows if not r.is_bf16 and r.starts]
        if not bf16:
            lines.append(f"| {name} | none starts | - | - | - | none starts | - | - | - |")
            continue
        best = max(bf16, key=best_key)
        plain = max((r for r in bf16 if r.speculative is None), key=best_key, default=None)
        ref = max(fp8, key=lambda r: r.tok_s) if fp8 else None
        lines.append(
            f"| {name} | {_name(best)} | {best.tok_s:,.0f} | {_days(best)} | "
            + (f"{_name(plain)} {plain.tok_s:,.0f}" if plain else "-")
            + f" | {_name(ref) if ref else '-'} | {f'{ref.tok_s:,.0f}' if ref else '-'} | "
            + (f"{best.tok_s / ref.tok_s:.2f}x" if ref else "-")
            + f" | {len(best.assumptions)} |"
        )
    return lines


def all_table(by_rig: dict[str, list[PlanRow]]) -> list[str]:
    lines = [
        "| rig | profile | layout | mem fraction | KV tokens | running (rated at) | gen tok/s | "
        "days | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in by_rig.items():
        ordered = sorted(rows, key=lambda r: (not r.is_bf16, -r.tok_s, r.profile))
        for row in ordered:
            dtype = "" if row.is_bf16 else f" ({row.kv_cache_dtype}, rejected)"
            if not row.starts:
                lines.append(
                    f"| {name} | {_name(row)}{dtype} | {row.parallelism} | "
                    f"{row.mem_fraction_static:.2f} | does not start | - | - | - | "
                    f"{row.evidence} |"
                )
                continue
            lines.append(
                f"| {name} | {_name(row)}{dtype} | {row.parallelism} | "
                f"{row.mem_fraction_static:.2f} | {_tokens(row.system_tokens)} | "
                f"{row.running} ({row.rated_running}) | "
                f"{row.tok_s:,.0f} | {_days(row)} | {row.evidence} |"
            )
    return lines


def render_tables() -> str:
    by_rig = {name: rig_rows(rig) for name, rig in rigs().items()}
    return "\n".join([*best_table(by_rig), "", *all_table(by_rig)]) + "\n"


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render_tables() + m.group(3), text)


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    if not BLOCK.search(text):
        print(f"{DOC}: no <!-- rigs: scripts/rig_table.py --> block", file=sys.stderr)
        return 1
    fresh = render(text)
    if "--check" in argv:
        if fresh != text:
            print(f"{DOC} is stale: run 'python scripts/rig_table.py'", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
