"""Record flags: recall and false-positive rate of each detector on hand-made answers, and the
cost of flagging one record on the hot path.

    python benchmarks/bench_flags.py

The answers are the docstrings of a fixed list of standard-library modules (ordinary prose and
code, canonically encoded with the bundled tokenizer) and one defective variant of each per flag
(``flag_eval``). The simulated-server figures are in ``tests/test_flags.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from flag_eval import hand_made_answers, render_scores, score

from eagledata.config import TokenizerSettings
from eagledata.quality.flags import FlagDetector
from eagledata.source.tokenization import PromptTokenizer


def main() -> None:
    tokenizer = PromptTokenizer(TokenizerSettings(name="bundled:tokenizer/tiny-chatml"))
    backend = tokenizer._tokenizer.backend_tokenizer
    detector = FlagDetector.from_vocab(tokenizer.token_id, tokenizer.roundtrip)
    stop = backend.token_to_id("<|im_end|>")

    def split(token: int) -> list[int] | None:
        piece = backend.id_to_token(token)
        if piece is None or token < 5:
            return None
        for k in range(1, len(piece)):
            left, right = backend.token_to_id(piece[:k]), backend.token_to_id(piece[k:])
            if left is not None and right is not None:
                return [left, right]
        return None

    answers = hand_made_answers(
        lambda text: list(backend.encode(text, add_special_tokens=False).ids),
        stop_id=stop,
        think_open=detector.think_open,
        think_close=detector.think_close,
        split=split,
        starts_word=lambda token: backend.decode([token])[:1].isspace(),
    )
    print(f"{len(answers):,} hand-made answers")
    print(render_scores(score(detector, answers)))

    # Cost per record: ordinary answers of about 4,000 tokens (the reference job's length).
    long_text = " ".join(backend.decode(a.output_ids[:-1]) for a in answers if a.kind == "ordinary")
    ids = list(backend.encode(long_text, add_special_tokens=False).ids)
    samples = [[*ids[i : i + 4000], stop] for i in range(0, len(ids) - 4000, 4000)][:200]
    timings: dict[str, list[float]] = {"all flags": [], "without roundtrip": []}
    bare = FlagDetector(detector.think_open, detector.think_close, None)
    for name, flagger in (("all flags", detector), ("without roundtrip", bare)):
        for output in samples:
            start = time.perf_counter()
            flagger.flags(input_ids=[1, 2], output_ids=output, finish_reason="stop", matched=stop)
            timings[name].append(time.perf_counter() - start)
    for name, values in timings.items():
        print(
            f"{name}: {statistics.median(values) * 1e3:.2f} ms median per 4,000-token answer "
            f"({len(values)} answers, Python {sys.version.split()[0]})"
        )


if __name__ == "__main__":
    main()
