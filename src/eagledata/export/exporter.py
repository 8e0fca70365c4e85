"""Wire an export: open the runs, stream their records through the selection and one format,
check every row's loss mask, write the data atomically, then the side files and the report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagledata.config import TokenizerSettings
from eagledata.errors import ExportError, RunDirError
from eagledata.export.format import ExportFormat, RowIdentity, RowMaker
from eagledata.export.formats import FORMATS
from eagledata.export.maskcheck import carries_mask, mask_problem
from eagledata.export.output import (
    atomic_target,
    check_target,
    side_path,
    write_bytes_atomic,
)
from eagledata.export.report import ExportReport, RunCounts, add_generation_outcomes
from eagledata.export.selection import DUPLICATE, Selection
from eagledata.export.vocab import (
    check_torch_available,
    count_supervised,
    draft_vocab_mapping,
    token_counts_json,
    write_vocab_mapping,
)
from eagledata.rundir.lines import RecordLine
from eagledata.rundir.reader import RunRecords
from eagledata.rundir.totals import count_mismatch


@dataclass(frozen=True)
class ExportOptions:
    format: str = "ids"
    keep: tuple[str, ...] = ()
    max_length: int | None = None
    tokenizer: str | None = None
    """Tokenizer name or dir; default: the one the runs were generated with."""
    force: bool = False
    token_counts: bool = False
    draft_vocab_size: int | None = None


def _open_runs(run_dirs: Sequence[Path]) -> list[RunRecords]:
    if not run_dirs:
        raise ExportError("no run directory given; pass one or more RUN_DIRs")
    runs = [RunRecords(path) for path in run_dirs]
    seen: dict[Path, Path] = {}
    for run in runs:
        resolved = run.path.resolve()
        if resolved in seen:
            raise ExportError(f"{run.path} is given twice; pass each run directory once")
        seen[resolved] = run.path
    if len(runs) > 1:
        names: dict[str, Path] = {}
        for run in runs:
            name = run.path.resolve().name
            if name in names:
                raise ExportError(
                    f"{names[name]} and {run.path} have the same name, so their row ids would "
                    "collide; rename one of the run directories"
                )
            names[name] = run.path
    return runs


def _input_files(runs: list[RunRecords]) -> list[Path]:
    """The local dataset files the runs were generated from: an export never writes over one."""
    from eagledata.source.dataset import local_path

    files: list[Path] = []
    for run in runs:
        try:
            members = run.frozen().members()
        except RunDirError:  # settings this release refuses: reading the records says so
            continue
        files.extend(local_path(member.dataset) for member in members)
    return [path for path in files if path.exists()]


def _tokenizer(runs: list[RunRecords], override: str | None) -> tuple[Any, dict[str, Any]]:
    """The runs' own tokenizer (they must share one) and its chat-template kwargs."""
    from eagledata.source.tokenization import PromptTokenizer

    settings = {run.path: run.frozen().tokenizer for run in runs}
    if override is not None:
        chosen = TokenizerSettings(name=override)
    else:
        distinct = {s.model_dump_json() for s in settings.values()}
        if len(distinct) > 1:
            names = ", ".join(sorted({s.name for s in settings.values()}))
            raise ExportError(
                f"the runs were generated with different tokenizers ({names}); export them "
                "separately, or pass --tokenizer"
            )
        chosen = next(iter(settings.values()))
    return PromptTokenizer(chosen).hf, dict(chosen.chat_template_kwargs)


def _identity(record: RecordLine, label: str | None) -> RowIdentity:
    record_id = record.id
    primary = f"{record.dataset}/{record.row_id}"
    if label is None:
        return RowIdentity(record_id, primary, "")
    return RowIdentity(f"{label}/{record_id}", f"{label}/{primary}", label)


def _checked(row: dict[str, Any], record: RecordLine, who: RowIdentity, fmt: str) -> None:
    """A row that carries a loss mask must carry the exact one (``maskcheck``): the trainers
    train on whatever mask they get. Raised here, the output is never renamed into place."""
    if not carries_mask(row):
        return
    problem = mask_problem(row, record.input_ids, record.output_ids)
    if problem is not None:
        raise ExportError(
            f"--format {fmt}: row {who.id}: {problem}; the export stopped and wrote nothing "
            "(a bug in this format's rows: please report it)"
        )


def _rows(
    runs: list[RunRecords],
    selection: Selection,
    maker: RowMaker,
    fmt: str,
    report: ExportReport,
    counts: Counter[int] | None,
) -> Iterator[dict[str, Any]]:
    """Every exported row, in run then shard order, each mask checked against its record;
    counts everything into ``report``."""
    seen: set[str] = set()
    several = len(runs) > 1
    for run in runs:
        label = run.path.resolve().name
        counts_of_run = RunCounts(run_dir=str(run.path), label=label)
        report.runs.append(counts_of_run)
        for record in run.records():
            counts_of_run.records += 1
            who = _identity(record, label if several else None)
            reason = selection.skip_reason(record)
            if reason is None and who.id in seen:
                reason = DUPLICATE
            row = maker.row(record, who) if reason is None else reason
            if isinstance(row, str):
                report.skipped_row(counts_of_run, row, who.id)
                continue
            _checked(row, record, who, fmt)
            seen.add(who.id)
            output = record.output_ids
            if counts is not None:
                count_supervised(counts, output)
            report.exported_row(
                counts_of_run,
                len(record.input_ids) + len(output),
                len(output),
                record.finish_reason,
            )
            yield row
        outcomes = run.outcomes()
        counts_of_run.planned = outcomes.planned
        counts_of_run.plan_complete = outcomes.plan_complete
        add_generation_outcomes(counts_of_run, outcomes.failed, outcomes.skipped)
        mismatch = count_mismatch(
            run.path,
            outcomes.planned,
            counts_of_run.records,
            sum(outcomes.failed.values()),
            sum(outcomes.skipped.values()),
            plan_complete=outcomes.plan_complete,
        )
        if mismatch is not None:  # status and verify call it an error; the export says it too
            report.warnings.append(mismatch)
        if not outcomes.plan_complete:
            report.warnings.append(
                f"{run.path} has not finished its plan; this export holds what it had so far"
            )


@dataclass
class RowStream:
    """An export's rows as they are made (each mask checked), and what it counts of them: the
    report fills as the rows are read."""

    format: ExportFormat
    rows: Iterator[dict[str, Any]]
    report: ExportReport
    maker: RowMaker
    tokenizer: Any
    counts: Counter[int] | None


def _open(
    run_dirs: Sequence[Path], options: ExportOptions
) -> tuple[ExportFormat, Selection, list[RunRecords]]:
    chosen = FORMATS.get(options.format)
    if chosen is None:
        raise ExportError(
            f"--format {options.format}: unknown format; use one of {', '.join(FORMATS)}"
        )
    selection = Selection.build(options.keep, options.max_length)
    if options.draft_vocab_size is not None:
        check_torch_available()
    return chosen, selection, _open_runs(run_dirs)


def _stream(
    chosen: ExportFormat,
    selection: Selection,
    runs: list[RunRecords],
    options: ExportOptions,
    out: Path,
) -> RowStream:
    tokenizer: Any = None
    template_kwargs: dict[str, Any] = {}
    if chosen.needs_tokenizer or options.draft_vocab_size is not None:
        tokenizer, template_kwargs = _tokenizer(runs, options.tokenizer)

    report = ExportReport(
        format=chosen.name,
        output=str(out),
        report_path=str(side_path(out, "export.json")),
        excluded_flags=sorted(selection.excluded),
        max_length=selection.max_length,
    )
    maker = chosen.rows(tokenizer, template_kwargs)
    counts: Counter[int] | None = (
        Counter() if options.token_counts or options.draft_vocab_size is not None else None
    )
    rows = _rows(runs, selection, maker, chosen.name, report, counts)
    return RowStream(chosen, rows, report, maker, tokenizer, counts)


def export_rows(run_dirs: Sequence[Path], options: ExportOptions) -> RowStream:
    """The rows ``export_runs`` would write, unwritten (the library's ``eagledata.dataset``):
    the same selection, formats and mask check."""
    chosen, selection, runs = _open(run_dirs, options)
    return _stream(chosen, selection, runs, options, Path("-"))


def export_runs(run_dirs: Sequence[Path], out: Path, options: ExportOptions) -> ExportReport:
    chosen, selection, runs = _open(run_dirs, options)
    check_target(
        out,
        is_dir=chosen.writes_folder,
        force=options.force,
        run_dirs=[r.path for r in runs],
        inputs=_input_files(runs),
    )
    stream = _stream(chosen, selection, runs, options, out)
    report, maker, tokenizer, counts, rows = (
        stream.report,
        stream.maker,
        stream.tokenizer,
        stream.counts,
        stream.rows,
    )
    with atomic_target(out, is_dir=chosen.writes_folder) as tmp:
        chosen.write(rows, tmp)
    report.files["data"] = str(out)

    if counts is not None and options.token_counts:
        path = side_path(out, "token_counts.json")
        write_bytes_atomic(path, token_counts_json(counts))
        report.files["token counts"] = str(path)
    if counts is not None and options.draft_vocab_size is not None:
        d2t, t2d = draft_vocab_mapping(counts, options.draft_vocab_size, len(tokenizer))
        path = side_path(out, "vocab_mapping.pt")
        write_vocab_mapping(d2t, t2d, path)
        report.files["vocab mapping"] = str(path)

    maker.note(report)
    write_bytes_atomic(
        Path(report.report_path),
        orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2),
    )
    return report
