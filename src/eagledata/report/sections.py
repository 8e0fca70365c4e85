"""A report section as data: its picture or the reason it has none; the number formats the
captions and the page share. No plotting library here: the page and the CLI's errors load fast."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH_IN = 10.0  # a full row of the page, in figure inches


@dataclass(frozen=True)
class Plot:
    """One section of the report: a picture with a caption, or the one line saying why not."""

    key: str
    title: str
    caption: str = ""
    png: bytes | None = None
    missing: str | None = None
    width_in: float = WIDTH_IN


def missing(key: str, title: str, why: str) -> Plot:
    return Plot(key=key, title=title, missing=why)


def share(count: int, total: int) -> str:
    return f"{count:,} ({count / total:.1%})" if total else f"{count:,}"


def duration(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
