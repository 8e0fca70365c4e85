"""The export report: what was written, what was left out and why, and the length to train at.

Printed, and written as JSON beside the data (``PATH`` -> ``PATH-stem.export.json`` in the same
folder), never inside a folder that a consumer globs. Every item of every run's plan is accounted
for: ``planned = exported + skipped``, where skipped counts the export's own exclusions (quality
flags, ``--max-length``, failed round trips, ...) and the items the run itself never turned into a
record (``generation_failed:REASON``, ``generation_skipped:REASON``, ``not_generated`` for what
is left), so the numbers reconcile with ``eagledata status``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagledata.rundir.percentile import percentile_of_sorted

NOT_GENERATED = "not_generated"


def _add(counts: dict[str, int], key: str, amount: int = 1) -> None:
    counts[key] = counts.get(key, 0) + amount


def _listing(counts: dict[str, int]) -> str:
    return ", ".join(
        f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


@dataclass
class RunCounts:
    run_dir: str
    label: str
    planned: int | None = None
    plan_complete: bool = False
    records: int = 0
    exported: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "label": self.label,
            "planned": self.planned,
            "plan_complete": self.plan_complete,
            "records": self.records,
            "exported": self.exported,
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_total": self.skipped_total,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
        }


@dataclass
class ExportReport:
    format: str
    output: str
    report_path: str
    excluded_flags: list[str]
    max_length: int | None
    runs: list[RunCounts] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    """``len(P + O)`` of every exported row (ints only: flat enough for 88k rows)."""
    supervised_tokens: int = 0
    skipped_ids: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    lossy: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    # --- filled while streaming ------------------------------------------------------------

    def exported_row(self, run: RunCounts, length: int, supervised: int, finish: str) -> None:
        run.exported += 1
        _add(run.finish_reasons, finish)
        self.lengths.append(length)
        self.supervised_tokens += supervised

    def skipped_row(self, run: RunCounts, reason: str, row_id: str) -> None:
        _add(run.skipped, reason)
        self.skipped_ids.setdefault(reason, []).append(row_id)

    # --- totals ---------------------------------------------------------------------------

    @property
    def exported(self) -> int:
        return sum(run.exported for run in self.runs)

    @property
    def skipped(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for run in self.runs:
            for reason, count in run.skipped.items():
                _add(total, reason, count)
        return total

    @property
    def finish_reasons(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for run in self.runs:
            for reason, count in run.finish_reasons.items():
                _add(total, reason, count)
        return total

    @property
    def planned(self) -> int | None:
        plans = [run.planned for run in self.runs]
        return None if any(p is None for p in plans) else sum(p for p in plans if p is not None)

    @property
    def reconciled(self) -> bool:
        return self.planned == self.exported + sum(self.skipped.values())

    def length_stats(self) -> dict[str, int | None]:
        ordered = sorted(self.lengths)
        return {
            "max": ordered[-1] if ordered else None,
            "p99": percentile_of_sorted(ordered, 0.99),
            "p50": percentile_of_sorted(ordered, 0.5),
        }

    def hand_off(self) -> list[str]:
        """How the trainers read this output (their own config keys and flags)."""
        longest = self.length_stats()["max"]
        length = "N" if longest is None else str(longest)
        if self.format == "ids":
            return [
                f"SpecForge: data.prompts_path: {self.output}, data.max_length: {length}",
                f"speculators: prepare-data --data {self.output} --seq-length {length}",
            ]
        if self.format == "hf":
            return [f"speculators: prepare-data --data hf:{self.output} --seq-length {length}"]
        if self.format == "conversations":
            return [
                f"SpecForge (lossy): prepare_hidden_states.py --data-path {self.output} "
                f"--max-length {length}, or data.train_data_path: {self.output}"
            ]
        return [
            f"SpecForge (lossy): data.train_data_path: {self.output}, data.is_preformatted: true, "
            f"data.max_length: {length}"
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "output": self.output,
            "selection": {"excluded_flags": self.excluded_flags, "max_length": self.max_length},
            "planned": self.planned,
            "exported": self.exported,
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_total": sum(self.skipped.values()),
            "reconciled": self.reconciled,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "sequence_length": self.length_stats(),
            "supervised_tokens": self.supervised_tokens,
            "total_tokens": sum(self.lengths),
            "runs": [run.to_json() for run in self.runs],
            "warnings": self.warnings,
            "lossy": self.lossy,
            "use": self.hand_off(),
            "files": self.files,
            "skipped_ids": {k: v for k, v in sorted(self.skipped_ids.items())},
        }

    def render(self) -> str:
        skipped = self.skipped
        skipped_total = sum(skipped.values())
        lines = [f"exported {self.exported:,} rows to {self.output} (format {self.format})"]
        lines.append(f"skipped  {skipped_total:,}" + (f": {_listing(skipped)}" if skipped else ""))
        planned = "?" if self.planned is None else f"{self.planned:,}"
        verdict = "" if self.reconciled else "  (does not reconcile: see the per-run counts)"
        lines.append(
            f"planned  {planned} = exported {self.exported:,} + skipped {skipped_total:,}{verdict}"
        )
        if self.finish_reasons:
            lines.append(f"finish   {_listing(self.finish_reasons)}")
        stats = self.length_stats()
        if stats["max"] is not None:
            lines.append(
                f"length   max {stats['max']:,}, p99 {stats['p99']:,}, p50 {stats['p50']:,} "
                f"tokens: train with max_length >= {stats['max']:,} (SpecForge data.max_length, "
                "speculators --seq-length) or rows are cut"
            )
        if len(self.runs) > 1:
            for run in self.runs:
                run_planned = "?" if run.planned is None else f"{run.planned:,}"
                lines.append(
                    f"run      {run.label}: planned {run_planned}, exported {run.exported:,}, "
                    f"skipped {run.skipped_total:,}"
                    + (f" ({_listing(run.skipped)})" if run.skipped else "")
                )
        lines.extend(f"use      {line}" for line in self.hand_off())
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        for kind, path in self.files.items():
            if kind != "data":
                lines.append(f"{kind}: {path}")
        lines.append(f"report   {self.report_path}")
        return "\n".join(lines)


def add_generation_outcomes(
    run: RunCounts, failed: dict[str, int], skipped: dict[str, int]
) -> None:
    """Count the items the run itself ended without a record, and what is still to generate."""
    for reason, count in failed.items():
        _add(run.skipped, f"generation_failed:{reason}", count)
    for reason, count in skipped.items():
        _add(run.skipped, f"generation_skipped:{reason}", count)
    if run.planned is not None:
        left = run.planned - run.records - sum(failed.values()) - sum(skipped.values())
        if left > 0:
            _add(run.skipped, NOT_GENERATED, left)
