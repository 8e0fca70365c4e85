"""The plan as text: profiles side by side, their notes, and which bf16 profile is fastest."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from eagledata.capacity.plan_row import PlanRow, best_key, written_for
from eagledata.capacity.speculative import format_speedups
from eagledata.capacity.workload import Workload
from eagledata.profiles.profile import Profile
from eagledata.profiles.rigs import Rig, rigs


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


WALL_UNITS = (("minutes", 1 / 60), ("hours", 1.0), ("days", 24.0))


def wall_unit(rows: Sequence[PlanRow]) -> tuple[str, float]:
    """The unit the wall-clock row reads best in: the longest estimate under 48 of it (a job of
    minutes is not '0.0 days')."""
    longest = max((r.wall_clock_hours_high or r.wall_clock_hours or 0.0 for r in rows), default=0)
    for name, hours in WALL_UNITS[:-1]:
        if longest / hours < 48:
            return name, hours
    return WALL_UNITS[-1]


def _wall(hours: float | None, unit_hours: float) -> str:
    return "-" if hours is None else f"{hours / unit_hours:,.1f}"


def output_tokens(count: float) -> str:
    """``396.0M output tokens``, ``10,240 output tokens``."""
    text = f"{count / 1e6:,.1f}M" if count >= 1e6 else f"{count:,.0f}"
    return f"{text} output tokens"


def _common_prefix(names: Sequence[str]) -> str:
    if len(names) < 2:
        return ""
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    cut = prefix.rfind("-")
    return prefix[: cut + 1] if cut >= 0 else ""


def _row_cells(row: PlanRow, unit: float) -> list[str]:
    dtype = row.kv_cache_dtype
    if not row.is_bf16:
        dtype = f"{dtype} REJECTED" if len(dtype) <= 6 else f"{dtype.split('_')[0]} REJECTED"
    pool = [dtype, row.parallelism, f"{row.mem_fraction_static:.2f}", f"{row.kv_gib_per_rank:.2f}"]
    mrr = str(row.recommended_max_running_requests)
    if row.profile_max_running_requests is not None:
        mrr += f" ({row.profile_max_running_requests})"
    return [
        *pool,
        _tokens(row.tokens_per_rank),
        _tokens(row.system_tokens),
        str(row.concurrent_4k),
        str(row.steady_concurrency),
        mrr,
        str(row.recommended_concurrency),
        _speculative_cell(row),
        f"{row.tok_s:,.0f}",
        f"{row.tok_s_low:,.0f}-{row.tok_s_high:,.0f}",
        f"{_wall(row.wall_clock_hours, unit)} ({_wall(row.wall_clock_hours_low, unit)}-"
        f"{_wall(row.wall_clock_hours_high, unit)})",
    ]


def _speculative_cell(row: PlanRow) -> str:
    spec = row.speculative
    if spec is None:
        return "-"
    mark = "" if spec.accept_length_measured else "?"
    return f"L {spec.accept_length:.2f}{mark} x{spec.speedup:.2f}"


_ROW_LABELS = [
    "KV cache dtype",
    "parallelism",
    "--mem-fraction-static",
    "KV GiB per rank",
    "KV tokens per rank",
    "KV tokens, system",
    "concurrent 4k requests",
    "steady-state running",
    "--max-running-requests",
    "eagledata --concurrency",
    "speculative (accept, gain)",
    "gen tok/s",
    "gen tok/s band",
    "wall clock, {unit}",
]


def render_plan_table(
    rows: Sequence[PlanRow],
    *,
    workload: Workload | None = None,
    width: int = 100,
    rig: Rig | None = None,
    elsewhere: Sequence[Profile] = (),
    written_here: Sequence[str] = (),
) -> str:
    """Profiles side by side (one column each, wrapped to ``width``), then status and notes
    per profile, then which bf16 profile is fastest and how it compares with a rejected row.

    Rejected (non-bf16, plan-only) columns come last. ``--max-running-requests`` shows the
    recommendation with the profile's own value in brackets. A profile that does not start on
    the rig (no pool, or its servers do not fit the rig's nodes) gets one line saying why
    instead of a column. ``rig`` heads the table with its GPUs and what carrying the reference's
    measurements over to it assumes; ``elsewhere`` names the profiles written for other rigs.
    """
    if not rows:
        return "no profiles to plan"
    ordered = [r for r in rows if r.is_bf16] + [r for r in rows if not r.is_bf16]
    prefix = _common_prefix([row.profile for row in ordered])
    all_headers = [row.profile[len(prefix) :] or row.profile for row in ordered]
    shown = [(h, r) for h, r in zip(all_headers, ordered, strict=True) if r.starts]
    failed = [(h, r) for h, r in zip(all_headers, ordered, strict=True) if not r.starts]
    headers = [h for h, _ in shown]
    started = [r for _, r in shown]
    unit_name, unit = wall_unit(started or ordered)
    labels = [label.format(unit=unit_name) for label in _ROW_LABELS]
    columns = [
        [header, *_row_cells(row, unit)] for header, row in zip(headers, started, strict=True)
    ]
    label_width = max(len(label) for label in labels)
    col_widths = [max(len(cell) for cell in column) for column in columns]

    lines: list[str] = []
    if workload is not None:
        samples = workload.samples_per_prompt
        lines.append(
            f"workload: {workload.num_prompts:,} prompts"
            + (f" x {samples} samples" if samples > 1 else "")
            + f", mean prompt {workload.mean_prompt_tokens:,.0f}, mean output "
            f"{workload.mean_output_tokens:,.0f}: {output_tokens(workload.total_output_tokens)}"
        )
        lines.append(
            f"  {workload.tokens_per_running_request:,.0f} KV tokens per running request; "
            "wall clock = output tokens / gen tok/s (prefill not counted)"
        )
    shared = _shared_rig_assumptions(ordered)
    if rig is not None:
        lines += _wrap(f"rig {rig.name}: {rig.summary()} [{rig.evidence}]", width, "", "  ")
        for assumption in shared:
            lines += _wrap(f"assumes: {assumption}", width, "  - ", "    ")
        if all(row.carried_over for row in ordered if not row.plan_only):
            said = (
                f"no profile is written for {rig.name}: those of the rigs they were written for, "
                "carried over as they are"
                if not written_here
                else f"the profiles named are written for other rigs, carried over as they are; "
                f"written for {rig.name}: {', '.join(written_here)}"
            )
            lines += _wrap(said, width, "", "  ")
    if prefix:
        lines.append(f"profiles {prefix}*")
    start = 0
    while start < len(columns):
        used = label_width
        end = start
        while end < len(columns) and (end == start or used + 2 + col_widths[end] <= width):
            used += 2 + col_widths[end]
            end += 1
        if start:
            lines.append("")
        chunk = range(start, end)
        for r, label in enumerate(["", *labels]):  # row 0: the profile names
            cells = "".join("  " + columns[i][r].ljust(col_widths[i]) for i in chunk)
            lines.append((label.ljust(label_width) + cells).rstrip())
        start = end

    for header, row in shown:
        lines.append("")
        status = row.status or "no status"
        if row.evidence and not status.startswith(row.evidence):
            status = f"[{row.evidence}] {status}"
        if not row.is_bf16:
            status += f" (kv-cache-dtype {row.kv_cache_dtype}, plan only)"
        if row.sglang_versions:
            status += f"; sglang {', '.join(row.sglang_versions)}"
        lines += _wrap(f"{header}: {status}", width, "", "  ")
        notes: list[str] = []
        spec = row.speculative
        if spec is not None:
            notes.append(
                f"speculative: {spec.algorithm}, {spec.num_steps} steps x top-k "
                f"{spec.eagle_topk}, {spec.num_draft_tokens} draft tokens, acceptance "
                f"{spec.accept_length:.2f} ({spec.accept_length_source}): "
                f"{row.tok_s:,.0f} tok/s vs {spec.tok_s_without:,.0f} without; "
                f"{spec.tok_s_pessimistic:,.0f} at acceptance 2.0"
            )
            notes.append(format_speedups(spec))
        notes += [*row.notes, *row.profile_notes]
        notes += [f"assumes: {a}" for a in row.assumptions if a not in shared]
        if row.settle:
            notes.append(f"settles it: {row.settle}")
        for note in notes:
            lines += _wrap(note, width, "  - ", "    ")

    if failed:
        where = f" on {rig.name}" if rig is not None else ""
        lines.append("")
        lines.append(f"does not start{where}:")
        for header, row in failed:
            why = row.notes[0] if row.notes else "no KV pool"
            dtype = "" if row.is_bf16 else f" ({row.kv_cache_dtype}, plan only)"
            lines += _wrap(f"{header}{dtype}: {why}", width, "  - ", "    ")
        if rig is not None:
            for bigger, names in _bigger_rigs(rig, elsewhere):
                lines += _wrap(
                    f"more {rig.gpu} GPUs: plan --rig {bigger.name} ({bigger.gpus} GPUs; "
                    f"written for it: {', '.join(names)})",
                    width,
                    "  ",
                    "    ",
                )
    if elsewhere:
        lines.append("")
        named = ", ".join(f"{p.name} ({', '.join(written_for(p))})" for p in elsewhere)
        lines += _wrap(f"written for other rigs (plan --rig NAME): {named}", width, "", "  ")

    lines.append("")
    lines += textwrap.wrap(PLAN_AND_CONTROLLER, width)
    lines.append("")
    for line in _verdict(ordered, all_headers, rig).splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        lines += _wrap(line.strip(), width, indent, indent + "  ")
    return "\n".join(lines)


def _bigger_rigs(rig: Rig, elsewhere: Sequence[Profile]) -> list[tuple[Rig, list[str]]]:
    """Rigs of the same GPU with more of them, and the launchable profiles written for each:
    where the weights leave room for a KV pool when they do not here."""
    found = []
    for other in rigs().values():
        if other.gpu != rig.gpu or other.gpus <= rig.gpus:
            continue
        names = [p.name for p in elsewhere if other.name in written_for(p) and not p.plan_only]
        if names:
            found.append((other, names))
    return found


def _shared_rig_assumptions(rows: Sequence[PlanRow]) -> list[str]:
    """The rig assumptions every row of the plan shares (printed once, under the rig)."""
    rig_rows = [row for row in rows if row.rig_assumptions]
    if not rig_rows or len(rig_rows) != len(rows):
        return []
    first = rig_rows[0].rig_assumptions
    return [a for a in first if all(a in row.rig_assumptions for row in rig_rows[1:])]


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


PLAN_AND_CONTROLLER = (
    "These are estimates from an assumed answer length, to choose a profile before a run. "
    "'eagledata generate' sizes its concurrency live (--concurrency auto, the default): it reads "
    "the server's KV usage, queue and retractions and learns the real answer lengths. The "
    "'eagledata --concurrency' row is its fallback for a server that reports no load "
    "(docs/throughput.md)."
)
"""How the planner's estimate and the live controller relate, printed under every plan."""


def _verdict(rows: Sequence[PlanRow], headers: Sequence[str], rig: Rig | None = None) -> str:
    named = list(zip(headers, rows, strict=True))
    bf16 = [(h, r) for h, r in named if r.is_bf16 and r.starts]
    rejected = [(h, r) for h, r in named if not r.is_bf16 and r.starts]
    if not bf16:
        where = f" on {rig.name}" if rig is not None else ""
        return f"no bf16 profile starts{where}: nothing here may generate data"
    best_name, best = max(bf16, key=lambda item: best_key(item[1]))
    text = f"best bf16 profile: {best_name}, ~{best.tok_s:,.0f} tok/s"
    if best.wall_clock_hours is not None:
        name, hours = wall_unit([best])
        text += f" ({best.wall_clock_hours / hours:,.1f} {name})"
    text += f" [{best.evidence or best.status or 'no status'}]"
    tied = [h for h, r in bf16 if h != best_name and round(r.tok_s) == round(best.tok_s)]
    if tied:
        text += f"; as fast: {', '.join(tied)} (on as many assumptions or more)"
    plain = [(h, r) for h, r in bf16 if r.speculative is None]
    spec = [(h, r) for h, r in bf16 if r.speculative is not None]
    if plain and spec:
        for label, group in (("without", plain), ("with", spec)):
            name, row = max(group, key=lambda item: best_key(item[1]))
            text += (
                f"\n  {label} speculative decoding: {name}, ~{row.tok_s:,.0f} tok/s "
                f"[{row.evidence or row.status or 'no status'}]"
            )
    if rejected:
        ref_name, ref = max(rejected, key=lambda item: item[1].tok_s)
        beating = [h for h, r in bf16 if r.tok_s >= ref.tok_s]
        text += f"\nrejected {ref_name} ({ref.kv_cache_dtype} KV): ~{ref.tok_s:,.0f} tok/s; " + (
            f"bf16 at or above it: {', '.join(beating)}" if beating else "no bf16 profile"
        )
        if ref.tok_s > 0:
            text += f"\n  the best bf16 profile is {best.tok_s / ref.tok_s:.2f}x it"
            if best.assumptions:
                text += f", on {len(best.assumptions)} assumptions never run (its 'assumes' above)"
    return text
