"""Read a report back: its sections, pictures, headline rows and embedded status (tests only)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import orjson

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Section:
    key: str
    title: str = ""
    caption: str = ""
    missing: str = ""
    images: list[bytes] = field(default_factory=list)


class ReportPage(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__()
        self.sections: dict[str, Section] = {}
        self.headline: dict[str, str] = {}
        self.status_text = ""
        self.external: list[str] = []  # any src/href that is not inline
        self.scripts = 0
        self._section: Section | None = None
        self._into: str | None = None
        self._row: str | None = None
        self.feed(html)

    @property
    def status(self) -> dict[str, Any]:
        value = orjson.loads(self.status_text)
        assert isinstance(value, dict)
        return value

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        for name in ("src", "href"):
            link = attr.get(name)
            if link is not None and not link.startswith(("data:", "#")):
                self.external.append(link)
        if tag == "script":
            self.scripts += 1
        if tag == "section" and attr.get("id"):
            self._section = self.sections.setdefault(str(attr["id"]), Section(str(attr["id"])))
        elif tag == "h2" and self._section is not None:
            self._into = "title"
        elif tag == "p" and self._section is not None:
            self._into = "caption" if attr.get("class") == "caption" else "missing"
        elif tag == "img" and self._section is not None:
            src = attr.get("src") or ""
            prefix = "data:image/png;base64,"
            assert src.startswith(prefix), src[:40]
            self._section.images.append(base64.b64decode(src[len(prefix) :]))
        elif tag == "tr" and attr.get("data-key"):
            self._row = str(attr["data-key"])
            self.headline[self._row] = ""
        elif tag == "td" and self._row is not None:
            self._into = "cell"
        elif tag == "pre" and attr.get("id") == "status-json":
            self._into = "status"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "p", "td", "pre"):
            self._into = None
        if tag == "tr":
            self._row = None
        if tag == "section" and self._section is not None and self._into is None:
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._into == "status":
            self.status_text += data
        elif self._into == "cell" and self._row is not None:
            self.headline[self._row] += data
        elif self._into in ("title", "caption", "missing") and self._section is not None:
            setattr(self._section, self._into, getattr(self._section, self._into) + data)
