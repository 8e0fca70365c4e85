"""Measuring the flag detectors: recall and false-positive rate on labelled answers.

Two sources of answers, each labelled with the flags it truly deserves:

* hand-made: ordinary prose and code (the docstrings of a fixed list of Python standard-library
  modules, encoded canonically with the run's tokenizer), and variants of them built to carry
  each defect (a loop appended until ``max_new_tokens``; the stop token alone; a token split
  into pieces no tokenizer would produce; a think block left open);
* simulated: records of a run against the simulated server, whose ``AnswerLedger`` says which
  answers it made empty or looping (``tests/test_flags.py``).

``benchmarks/bench_flags.py`` prints the figures quoted in docs/quality.md.
"""

from __future__ import annotations

import importlib
import random
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from eagledata.quality.flags import (
    DEGENERATE,
    EMPTY,
    ROUNDTRIP_MISMATCH,
    TRUNCATED,
    UNBALANCED_THINK,
    FlagDetector,
)

CORPUS_MODULES = (
    "abc",
    "argparse",
    "array",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "bz2",
    "calendar",
    "codecs",
    "collections",
    "colorsys",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email",
    "enum",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "html.parser",
    "http.client",
    "imaplib",
    "importlib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "locale",
    "logging",
    "lzma",
    "math",
    "mimetypes",
    "multiprocessing",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "platform",
    "poplib",
    "pprint",
    "queue",
    "random",
    "re",
    "reprlib",
    "sched",
    "selectors",
    "shelve",
    "shutil",
    "signal",
    "smtplib",
    "socket",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "symtable",
    "sysconfig",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "tomllib",
    "traceback",
    "types",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml.etree.ElementTree",
    "zipfile",
    "zlib",
)


def ordinary_texts(min_chars: int = 200) -> list[str]:
    """Docstrings (prose, examples, code) of modules and their members, deduplicated."""
    texts: dict[str, None] = {}
    for name in CORPUS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        with warnings.catch_warnings():  # typing.io and friends warn when touched
            warnings.simplefilter("ignore")
            members = [getattr(module, member, None) for member in sorted(dir(module))]
            docs = [getattr(obj, "__doc__", None) for obj in [module, *members]]
        for doc in docs:
            if isinstance(doc, str) and len(doc) >= min_chars:
                texts[doc.strip()] = None
    return list(texts)


@dataclass(frozen=True, slots=True)
class Answer:
    input_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    matched: int | None
    truth: frozenset[str]
    kind: str
    unscored: frozenset[str] = frozenset()
    """Flags whose truth this construction does not know (a loop's seams or a cut may or may
    not survive a round trip: only the round trip itself can say): not counted either way."""


@dataclass
class Score:
    """Counts of one detector over labelled answers."""

    positives: int = 0
    negatives: int = 0
    hits: int = 0
    false_alarms: int = 0
    missed: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.hits / self.positives if self.positives else None

    @property
    def false_positive_rate(self) -> float | None:
        return self.false_alarms / self.negatives if self.negatives else None


Encoder = Callable[[str], list[int]]


def hand_made_answers(
    encode: Encoder,
    *,
    stop_id: int,
    think_open: int | None,
    think_close: int | None,
    split: Callable[[int], list[int] | None],
    starts_word: Callable[[int], bool],
    max_new_tokens: int = 512,
    seed: int = 7,
) -> list[Answer]:
    """Every ordinary text as a clean answer, and one defective variant of each per flag.

    ``split(id)`` gives ids that decode to the same text as ``id`` but are not how the
    tokenizer encodes it (None when ``id`` is a single byte/character and cannot be split);
    ``starts_word(id)`` says whether a token begins a word (a think tag goes before one, where
    it does not change how the text around it is encoded).
    """
    rng = random.Random(seed)
    prompt = encode("Answer the question.")
    answers: list[Answer] = []
    for text in ordinary_texts():
        body = encode(text)
        if len(body) >= max_new_tokens:  # shorten at a word start, as an answer would end
            end = max(i for i in range(1, max_new_tokens) if starts_word(body[i]))
            body = body[:end]
        if len(body) < 16:
            continue
        answers.append(Answer(prompt, [*body, stop_id], "stop", stop_id, frozenset(), "ordinary"))
        # A loop: the model repeats a span of what it said until it runs out of tokens.
        period = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 120])
        lead = rng.randrange(0, max(1, min(len(body), max_new_tokens // 2) - period))
        cycle = body[lead : lead + period]
        if len(cycle) == period:
            looped = body[: lead + period]
            while len(looped) < max_new_tokens:
                looped.extend(cycle)
            answers.append(
                Answer(
                    prompt,
                    looped[:max_new_tokens],
                    "length",
                    None,
                    frozenset({DEGENERATE, TRUNCATED}),
                    f"loop/{period}",
                    frozenset({ROUNDTRIP_MISMATCH}),
                )
            )
        # Cut at max_new_tokens without a loop.
        if len(body) >= 64:
            answers.append(
                Answer(
                    prompt,
                    body[:64],
                    "length",
                    None,
                    frozenset({TRUNCATED}),
                    "truncated",
                    frozenset({ROUNDTRIP_MISMATCH}),
                )
            )
        # Not the tokenizer's own encoding: one multi-character token spelled in pieces.
        where = [i for i, token in enumerate(body) if split(token)]
        if where:
            i = rng.choice(where)
            pieces = split(body[i]) or []
            odd = [*body[:i], *pieces, *body[i + 1 :], stop_id]
            truth = {ROUNDTRIP_MISMATCH}
            answers.append(Answer(prompt, odd, "stop", stop_id, frozenset(truth), "split"))
        if think_open is not None and think_close is not None:
            cut = rng.choice([i for i in range(1, len(body)) if starts_word(body[i])] or [1])
            closed = [*body[:cut], think_close, *body[cut:], stop_id]
            answers.append(
                Answer([*prompt, think_open], closed, "stop", stop_id, frozenset(), "think")
            )
            opened = [think_open, *body, stop_id]
            answers.append(
                Answer(prompt, opened, "stop", stop_id, frozenset({UNBALANCED_THINK}), "think_open")
            )
            never = [*body, stop_id]
            answers.append(
                Answer(
                    [*prompt, think_open],
                    never,
                    "stop",
                    stop_id,
                    frozenset({UNBALANCED_THINK}),
                    "think_open",
                )
            )
    answers.append(Answer(prompt, [stop_id], "stop", stop_id, frozenset({EMPTY}), "empty"))
    answers.append(Answer(prompt, [], "stop", None, frozenset({EMPTY}), "empty"))
    return answers


def score(detector: FlagDetector, answers: Iterable[Answer]) -> dict[str, Score]:
    """Recall and false-positive rate of each flag over labelled answers."""
    scores = {flag: Score() for flag in (TRUNCATED, EMPTY, DEGENERATE, ROUNDTRIP_MISMATCH)}
    if detector.think_open is not None:
        scores[UNBALANCED_THINK] = Score()
    for answer in answers:
        found = set(
            detector.flags(
                input_ids=answer.input_ids,
                output_ids=answer.output_ids,
                finish_reason=answer.finish_reason,
                matched=answer.matched,
            )
        )
        for flag, tally in scores.items():
            if flag in answer.unscored:
                continue
            if flag in answer.truth:
                tally.positives += 1
                if flag in found:
                    tally.hits += 1
                else:
                    tally.missed.append(answer.kind)
            else:
                tally.negatives += 1
                if flag in found:
                    tally.false_alarms += 1
                    tally.missed.append(f"false:{answer.kind}")
    return scores


def render_scores(scores: dict[str, Score]) -> str:
    lines = [
        "| flag | positives | recall | negatives | false-positive rate |",
        "|---|---|---|---|---|",
    ]
    for flag, tally in scores.items():
        recall = "-" if tally.recall is None else f"{tally.recall:.1%}"
        fpr = "-" if tally.false_positive_rate is None else f"{tally.false_positive_rate:.2%}"
        lines.append(f"| `{flag}` | {tally.positives:,} | {recall} | {tally.negatives:,} | {fpr} |")
    return "\n".join(lines)
