"""The writing systems of prompts: a cheap count of letters per Unicode script.

A drafter trained on one language drafts poorly in another (the Kimi-K2.5 EAGLE-3 drafter gained
most on Chinese benchmarks once Chinese data joined its mix), so the report shows which scripts
each dataset's prompts are written in. Only letters count (digits, punctuation, spaces and
symbols are shared by all scripts); the first ``SAMPLE_CHARS`` characters of a prompt decide.
ASCII text (most of it) takes one regex pass; other text one pass per script, at C speed.
"""

from __future__ import annotations

import re
from collections import Counter

SAMPLE_CHARS = 2000
SCRIPTS: tuple[tuple[str, str], ...] = (
    ("Latin", "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"),
    ("Cyrillic", "\u0400-\u052f"),
    ("Greek", "\u0370-\u03ff\u1f00-\u1fff"),
    ("Han", "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"),
    ("Kana", "\u3040-\u30ff\u31f0-\u31ff"),
    ("Hangul", "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"),
    ("Arabic", "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff"),
    ("Hebrew", "\u0590-\u05ff"),
    ("Devanagari", "\u0900-\u097f"),
    ("Thai", "\u0e00-\u0e7f"),
)
OTHER = "other"
_PATTERNS = tuple((name, re.compile(f"[{ranges}]")) for name, ranges in SCRIPTS)
_ASCII_LETTER = re.compile("[A-Za-z]")


def script_letters(text: str) -> Counter[str]:
    """Letters per script in the start of ``text`` (``other``: letters of no script listed)."""
    sample = text[:SAMPLE_CHARS]
    counts: Counter[str] = Counter()
    if sample.isascii():
        letters = len(_ASCII_LETTER.findall(sample))
        if letters:
            counts["Latin"] = letters
        return counts
    found = 0
    for name, pattern in _PATTERNS:
        letters = len(pattern.findall(sample))
        if letters:
            counts[name] = letters
            found += letters
    rest = sum(1 for char in sample if char.isalpha()) - found
    if rest > 0:
        counts[OTHER] = rest
    return counts


def dominant_script(counts: Counter[str]) -> str | None:
    """The script most of a prompt's letters are in; None for a prompt without letters."""
    if not counts:
        return None
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]
