"""Build the sample prompt datasets shipped in ``src/eagledata/assets/samples``.

Every file is a pure function of the tables in this script: rebuilding reproduces the shipped copy
byte for byte (``--check`` verifies that). Edit the tables here, never the generated files.

Files (see the README.md written next to them):

* ``sharegpt.jsonl``  ShareGPT rows ``{"id", "conversations": [{"from", "value"}]}``
* ``sharegpt.json``   the first 10 of those rows as one JSON array
* ``ultrachat.jsonl`` ultrachat_200k rows
  ``{"prompt", "prompt_id", "messages": [{"role", "content"}]}``
* ``prompts.jsonl``   plain ``{"prompt"}`` rows, no id
* ``prompts.parquet`` the same prompts, one ``prompt`` column
* ``bad_rows.jsonl``  one good or bad row per line, each kind of bad row once

Usage::

    python scripts/build_samples.py [OUT_DIR] [--check]
"""

# ruff: noqa: RUF001  (the sample texts are deliberately multilingual)

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _rebuild import rebuild_main  # scripts/_rebuild.py, beside this file

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "src" / "eagledata" / "assets" / "samples"

# --- content tables ---------------------------------------------------------------------------
# Some values carry edge cases that must survive untouched, byte for byte: leading and trailing
# whitespace, blank lines, tabs, CRLF, decomposed accents (NFD, never normalise), RTL scripts,
# emoji ZWJ sequences, astral-plane characters, CJK.

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in at most three sentences.",
    "Tu es un assistant qui répond toujours en français.",
    "  You are a careful coding assistant.\n\nAlways explain your reasoning before the code.  ",
    "你是一个乐于助人的助手。请用中文回答。",
    "You are a tutor for children aged 8 to 10. Use simple words. 🙂",
    "أنت مساعد مفيد. أجب باللغة العربية.",
]

# (question, answer) pairs: the first human turn and the gpt reply of ShareGPT row i.
QA = [
    (
        "What is the capital of Australia?",
        "The capital of Australia is Canberra, not Sydney as many people assume.",
    ),
    (
        "Write a haiku about autumn leaves.",
        "Crimson leaves descend\nwhispering to the cold ground\nsummer's last goodbye",
    ),
    (
        "Explain recursion to a five-year-old.",
        "Imagine a set of nesting dolls. To find the smallest doll you open one doll, and inside "
        "is another doll, and you keep opening until there are no more dolls inside.",
    ),
    (
        "こんにちは！日本のおすすめの観光地を三つ教えてください。",
        "京都の伏見稲荷大社、北海道の富良野、そして沖縄の美ら海水族館がおすすめです。",
    ),
    (
        "   Please keep the leading spaces and the trailing newlines of this message.\n\n",
        "  Kept. The spaces before this sentence are part of the answer too.  ",
    ),
    (
        "Translate to Spanish: 'Where is the train station?'",
        "¿Dónde está la estación de tren?",
    ),
    (
        "def add(a, b):\n    return a - b\n\nWhy does add(2, 3) return -1?",
        "The function subtracts instead of adding. Change the body to:\n\n"
        "```python\ndef add(a, b):\n    return a + b\n```",
    ),
    (
        "ما هي عاصمة مصر؟",
        "عاصمة مصر هي القاهرة.",
    ),
    (
        "Give me three emoji that describe a birthday party.",
        "🎉 🎂 🎈 — and for the whole family: 👨\u200d👩\u200d👧\u200d👦",
    ),
    (
        "Is “cafe\u0301” (with a combining accent) the same string as “café”?",
        "They look the same but differ in code points: cafe\u0301 is e + U+0301, while café uses "
        "the precomposed U+00E9. Unicode normalisation (NFC) would make them equal.",
    ),
    (
        "List the planets of the solar system in order.",
        "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune.",
    ),
    (
        "Summarise the plot of Romeo and Juliet in two sentences.",
        "Two young lovers from feuding families in Verona marry in secret. A chain of "
        "misunderstandings ends with both taking their own lives, which reconciles the families.",
    ),
    (
        "Line one\n\n\nLine four after two blank lines\n\t- a tab-indented bullet",
        "I see four lines, two of them blank, and a bullet indented with a tab.",
    ),
    (
        "שלום! מה מזג האוויר בתל אביב בדרך כלל בקיץ?",
        "בקיץ בתל אביב חם ולח, בדרך כלל סביב 30 מעלות.",
    ),
    (
        "What is 17 * 23?",
        "17 * 23 = 391.",
    ),
    (
        "请解释一下什么是机器学习。",
        "机器学习是人工智能的一个分支，它让计算机通过数据自动学习规律，而不需要明确编程。",
    ),
    (
        "Write a SQL query that counts orders per customer.",
        "SELECT customer_id, COUNT(*) AS orders\nFROM orders\nGROUP BY customer_id;",
    ),
    (
        "Windows line endings:\r\nsecond line\r\nthird line",
        "Your message used CRLF line endings.\r\nI kept them.",
    ),
    (
        "Quelle est la différence entre « tu » et « vous » ?",
        "« Tu » est informel et singulier ; « vous » est formel ou pluriel.",
    ),
    (
        "How do I reverse a list in Python?",
        "Use `my_list.reverse()` to reverse in place, or `my_list[::-1]` for a reversed copy.",
    ),
    (
        "안녕하세요! 한국어로 자기소개를 해 주세요.",
        "안녕하세요, 저는 여러분을 돕는 인공지능 도우미입니다. 만나서 반갑습니다!",
    ),
    (
        "Mathematical alphabet: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and a rare CJK ideograph 𠀀. How many code points?",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 is 7 code points outside the BMP, and 𠀀 (U+20000) is one more.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and shorter blue wavelengths scatter far more than "
        "red ones (Rayleigh scattering), so the sky looks blue from every direction.",
    ),
    (
        "Привет! Как по-русски будет «thank you very much»?",
        "«Большое спасибо».",
    ),
    (
        "Give me a JSON object with keys name and age.",
        '{"name": "Ada", "age": 36}',
    ),
    (
        "Tell me a joke about programmers. 🤖",
        "Why do programmers prefer dark mode? Because light attracts bugs. 🐛",
    ),
    (
        "Vietnamese diacritics: Tiếng Việt có nhiều dấu. Can you name the tones?",
        "Ngang, huyền, sắc, hỏi, ngã and nặng: six tones.",
    ),
    (
        "What does HTTP status code 429 mean?",
        "429 Too Many Requests: the client sent too many requests in a given time window.",
    ),
    (
        "नमस्ते! भारत की राजधानी क्या है?",
        "भारत की राजधानी नई दिल्ली है।",
    ),
    (
        "\n\nA message that starts with two blank lines.",
        "\nAnd an answer that starts with one.",
    ),
    (
        "Convert 100 degrees Fahrenheit to Celsius.",
        "(100 - 32) × 5/9 ≈ 37.8 °C.",
    ),
    (
        "What is the difference between a process and a thread?",
        "A process has its own address space; threads share the address space of their process.",
    ),
    (
        "Flags and skin tones: 🏳️\u200d🌈 👋🏽 👍🏿 — how are these encoded?",
        "As sequences: a flag plus ZWJ plus rainbow, and a base emoji plus a skin-tone modifier.",
    ),
    (
        "Ελληνικά: Τι σημαίνει «ευχαριστώ»;",
        "Σημαίνει «thank you».",
    ),
    (
        "Name a prime number between 90 and 100.",
        "97 is the only prime between 90 and 100.",
    ),
    (
        "Write one sentence using the word 'serendipity'.",
        "Finding my favourite book in a stranger's garage sale was pure serendipity.",
    ),
    (
        "Türkçe bir atasözü söyler misin?",
        "Damlaya damlaya göl olur.",
    ),
    (
        "What is a mutex?",
        "A mutual-exclusion lock: only one thread may hold it at a time.",
    ),
    (
        "Mixed direction: the word שלום means peace, and مرحبا means hello.",
        "Right: שלום is Hebrew and مرحبا is Arabic, both written right to left.",
    ),
    (
        "Explain what a tokenizer does in one paragraph.",
        "A tokenizer splits text into units from a fixed vocabulary and maps each to an integer "
        "id, so a model can read text as numbers. Byte-level tokenizers can encode any string.",
    ),
]

FOLLOW_UPS = [
    ("Can you make that shorter?", "Sure."),
    ("Thanks! Can you give one more example?", "Of course — here is another one."),
    ("Why?", "Because that is how it is defined."),
    ("Could you say that in French?", "Bien sûr !"),
    ("  And in one word?  ", "Yes."),
    ("谢谢！还有别的吗？", "没有了。"),
    ("Great 👍 what next?", "Next, try it yourself."),
]

PROMPTS = [
    "What is the tallest mountain in the world?",
    "Write a limerick about a cat who learns to code.",
    "Explain the difference between TCP and UDP.",
    "List five fruits that are red.",
    "How many seconds are there in a leap year?",
    "   Leading spaces, trailing spaces, and a trailing newline.   \n",
    "Write a Python function that checks whether a string is a palindrome.",
    "什么是量子计算？请简单解释。",
    "Describe the water cycle for a ten-year-old.",
    "What are the main causes of inflation?",
    "Translate into German: 'I would like a cup of coffee, please.'",
    "Give me a recipe for pancakes 🥞 with exact quantities.",
    "Paragraph one.\n\nParagraph two, after a blank line.\n\n\nParagraph three, after two.",
    "ما هو أطول نهر في العالم؟",
    "Compare bubble sort and merge sort in a table.",
    "Résumé, naïve, façade — and the decomposed forms: re\u0301sume\u0301, nai\u0308ve.",
    "Write a short story that begins with: 'The lighthouse went dark at midnight.'",
    "東京から大阪まで新幹線でどのくらいかかりますか？",
    "What is the derivative of x^3 + 2x?",
    "Suggest three names for a bakery.",
    "\tTab-indented prompt with a tab\tin the middle.",
    "Explain what a hash map is and when to use it.",
    "Why do cats purr?",
    "한국의 전통 음식 세 가지를 알려주세요.",
    "Write a regular expression that matches an email address.",
    "What happened in 1969 that was important for space exploration?",
    "Family emoji 👨\u200d👩\u200d👧\u200d👦 and a rainbow flag 🏳️\u200d🌈: describe them.",
    "Give me a motivational quote and explain it.",
    "How does public-key cryptography work?",
    "שאלה בעברית: כמה ימים יש בשבוע?",
]

# ultrachat_200k style: several user turns, each answered; the row ends with an assistant turn.
ULTRACHAT = [
    [
        (
            "How do solar panels generate electricity?",
            "Photovoltaic cells turn light into current.",
        ),
        ("Are they efficient in winter?", "Yes, cold even helps; short days reduce the yield."),
    ],
    [("Write a tweet announcing a new coffee shop.", "☕ Now open on Main Street! Come say hi.")],
    [
        ("What is the Pythagorean theorem?", "In a right triangle, a² + b² = c²."),
        ("Give an example.", "A 3-4-5 triangle: 9 + 16 = 25."),
        ("And a non-integer one?", "1, 1 and √2."),
    ],
    [("Explain photosynthesis briefly.", "Plants turn light, water and CO₂ into sugar and O₂.")],
    [
        ("请推荐一本中文小说。", "推荐余华的《活着》。"),
        ("为什么？", "它文字朴素，却非常感人。"),
    ],
    [("What are the benefits of regular exercise?", "Better mood, sleep, heart and strength.")],
    [
        ("How do I make a cup of green tea?", "Steep 2 g of leaves in 80 °C water for 2 minutes."),
        ("Why not boiling water?", "It makes green tea bitter."),
    ],
    [("Summarise the French Revolution.", "1789–1799: monarchy overthrown, a republic founded.")],
    [
        (
            "  Please keep my indentation:\n    step 1\n    step 2",
            "  Kept:\n    step 1\n    step 2",
        ),
    ],
    [("What is an API?", "An interface through which programs talk to each other.")],
    [
        ("Tell me about the Great Barrier Reef.", "The world's largest coral reef system."),
        ("Is it in danger?", "Yes: warming seas cause coral bleaching."),
    ],
    [
        (
            "Write a haiku about rain. 🌧️",
            "Soft rain on tin roofs\nthe city hums a lullaby\npuddles hold the sky",
        )
    ],
    [
        ("¿Cuál es la montaña más alta de España?", "El Teide, en Tenerife, con 3715 m."),
        ("¿Y en la península?", "El Mulhacén, con 3479 m."),
    ],
    [("What is the boiling point of water on Everest?", "About 70 °C, because of low pressure.")],
    [
        (
            "Explain blockchain in one sentence.",
            "A shared, append-only ledger kept in sync by many.",
        ),
        ("Is it a database?", "A very slow and very redundant one, yes."),
    ],
    [("Give me three tips for better sleep.", "Fixed schedule, dark room, no screens late.")],
    [("Describe the taste of umami.", "Savoury and brothy, like parmesan or soy sauce.")],
    [
        ("مرحبا! كيف أتعلم البرمجة؟", "ابدأ بلغة بايثون وتمرّن كل يوم."),
        ("شكرا!", "عفوا!"),
    ],
    [
        (
            "What is the difference between weather and climate?",
            "Weather is today; climate is decades.",
        )
    ],
    [("Name three composers of the Baroque era.", "Bach, Handel and Vivaldi.")],
    [
        ("How does a refrigerator work?", "A refrigerant carries heat from inside to outside."),
        ("Why is the back warm?", "That is the heat being released."),
    ],
    [
        (
            "Why do leaves change colour in autumn?",
            "Chlorophyll breaks down and reveals other pigments.",
        )
    ],
    [("Line one\r\nLine two with CRLF", "Both lines received.\r\nCRLF kept.")],
    [("What is the speed of light?", "299,792,458 metres per second in vacuum.")],
    [
        ("日本の首都はどこですか？", "東京です。"),
        ("人口は？", "約1400万人です。"),
    ],
    [("Suggest a name for a pet turtle. 🐢", "Sheldon.")],
    [("What is a black hole?", "A region where gravity is so strong that not even light escapes.")],
    [("Explain supply and demand.", "Prices rise when demand exceeds supply and fall otherwise.")],
    [
        ("What is Rust known for?", "Memory safety without a garbage collector."),
        ("And Go?", "Simplicity and goroutines."),
    ],
    [("Décris la tour Eiffel en une phrase.", "Une tour de fer de 330 m construite pour 1889.")],
]
# These ultrachat rows open with a system message (ultrachat_200k itself never does).
ULTRACHAT_SYSTEM = {3: 0, 12: 2, 25: 5}

# --- builders ---------------------------------------------------------------------------------


def sharegpt_rows() -> list[dict[str, object]]:
    """40 rows. The shape cycles with ``i % 4``: one human turn; human+gpt; two full exchanges;
    human+gpt+human (ends on a human turn). Every fifth row (i % 5 == 2) starts with a system turn.
    """
    rows: list[dict[str, object]] = []
    for i, (question, answer) in enumerate(QA):
        turns: list[dict[str, str]] = []
        if i % 5 == 2:
            turns.append({"from": "system", "value": SYSTEM_PROMPTS[i // 5 % len(SYSTEM_PROMPTS)]})
        turns.append({"from": "human", "value": question})
        shape = i % 4
        if shape >= 1:
            turns.append({"from": "gpt", "value": answer})
        if shape >= 2:
            follow_q, follow_a = FOLLOW_UPS[i % len(FOLLOW_UPS)]
            turns.append({"from": "human", "value": follow_q})
            if shape == 2:
                turns.append({"from": "gpt", "value": follow_a})
        rows.append({"id": f"sharegpt-{i:03d}", "conversations": turns})
    return rows


def ultrachat_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, exchanges in enumerate(ULTRACHAT):
        messages: list[dict[str, str]] = []
        if i in ULTRACHAT_SYSTEM:
            messages.append({"role": "system", "content": SYSTEM_PROMPTS[ULTRACHAT_SYSTEM[i]]})
        for user, assistant in exchanges:
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        prompt = exchanges[0][0]
        prompt_id = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        rows.append({"prompt": prompt, "prompt_id": prompt_id, "messages": messages})
    return rows


LONG_PROMPT_CHARS = 30_000


def long_prompt() -> str:
    sentence = "Item {n:05d}: the quick brown fox jumps over the lazy dog and keeps on running. "
    text = "Repeat the gist of the following list in one line.\n"
    n = 0
    while len(text) < LONG_PROMPT_CHARS:
        text += sentence.format(n=n)
        n += 1
    return text[:LONG_PROMPT_CHARS]


def _line(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def _conv(row_id: str, *turns: tuple[str, object]) -> bytes:
    return _line({"id": row_id, "conversations": [{"from": f, "value": v} for f, v in turns]})


# (id, kind, what eagledata should do, raw line). Line numbers are 1-based positions in this list.
BAD_ROWS: list[tuple[str, str, str, bytes]] = [
    (
        "good-001",
        "good ShareGPT row",
        "process normally",
        _conv("good-001", ("human", "What is 2 + 2?"), ("gpt", "4.")),
    ),
    (
        "bad-malformed-json",
        "malformed JSON (Python-style single quotes)",
        "failure file, reason: invalid JSON; id unknown, record the line number",
        b"{'id': 'bad-malformed-json', 'conversations': [{'from': 'human', 'value': 'hi'}]}\n",
    ),
    (
        "good-002",
        "good ShareGPT row with a system turn",
        "process normally",
        _conv(
            "good-002",
            ("system", "You are a helpful assistant."),
            ("human", "Name a colour."),
        ),
    ),
    (
        "bad-truncated",
        "truncated line (JSON cut off mid-string, no closing braces)",
        "failure file, reason: invalid JSON; id unknown, record the line number",
        b'{"id": "bad-truncated", "conversations": [{"from": "human", "value": "This line was cu\n',
    ),
    (
        "bad-empty-conversations",
        'empty conversation list ("conversations": [])',
        "failure file, reason: empty conversation",
        _line({"id": "bad-empty-conversations", "conversations": []}),
    ),
    (
        "bad-no-known-field",
        "no known field (neither conversations, messages nor prompt)",
        "failure file, reason: no conversations/messages/prompt field",
        _line({"id": "bad-no-known-field", "question": "Where is it?", "answer": "Here."}),
    ),
    (
        "bad-unknown-role",
        'unknown role ("from": "robot")',
        "failure file, reason: unknown role 'robot'",
        _conv("bad-unknown-role", ("human", "Hello?"), ("robot", "BEEP."), ("human", "Hello??")),
    ),
    (
        "bad-content-number",
        "non-string content: a number",
        "failure file, reason: content is not a string",
        _conv("bad-content-number", ("human", 42)),
    ),
    (
        "bad-content-list",
        "non-string content: a list",
        "failure file, reason: content is not a string",
        _conv("bad-content-list", ("human", ["What", "is", "this?"])),
    ),
    (
        "bad-content-null",
        "non-string content: null",
        "failure file, reason: content is not a string",
        _conv("bad-content-null", ("human", None)),
    ),
    (
        "bad-no-user-turn",
        "no user turn (system and gpt turns only)",
        "failure file, reason: no user turn",
        _conv(
            "bad-no-user-turn",
            ("system", "You are a helpful assistant."),
            ("gpt", "I am talking to myself."),
        ),
    ),
    (
        "bad-empty-prompt",
        'empty-string prompt ("prompt": "")',
        "failure file, reason: empty prompt",
        _line({"id": "bad-empty-prompt", "prompt": ""}),
    ),
    (
        "bad-invalid-utf8",
        "invalid UTF-8 (raw bytes 0xE9 and 0xFF 0xFE inside the value)",
        "failure file, reason: invalid UTF-8; the rest of the file is still read",
        b'{"id": "bad-invalid-utf8", "conversations": '
        b'[{"from": "human", "value": "caf\xe9 \xff\xfe"}]}\n',
    ),
    (
        "bad-too-long",
        f"over-long prompt ({LONG_PROMPT_CHARS} characters in one human turn)",
        "failure file, reason: prompt longer than the context/max-prompt limit",
        _conv("bad-too-long", ("human", long_prompt())),
    ),
    (
        "good-003",
        "good ShareGPT row, multi-turn, ends on a human turn",
        "process normally",
        _conv(
            "good-003",
            ("human", "Hi!"),
            ("gpt", "Hello! 👋"),
            ("human", "Say hi in Japanese."),
        ),
    ),
]


def readme(bad_rows: list[tuple[str, str, str, bytes]], sizes: dict[str, int]) -> str:
    bad_table = "\n".join(
        f"| {n} | `{row_id}` | {kind} | {action} |"
        for n, (row_id, kind, action, _) in enumerate(bad_rows, start=1)
    )
    schemas = {
        "sharegpt.jsonl": 'ShareGPT: `{"id", "conversations": [{"from", "value"}]}`, '
        "`from` one of `system`, `human`, `gpt`",
        "sharegpt.json": f"one JSON array holding the first {sizes['sharegpt.json']} rows "
        "of `sharegpt.jsonl`",
        "ultrachat.jsonl": "HuggingFaceH4/ultrachat_200k: "
        '`{"prompt", "prompt_id", "messages": [{"role", "content"}]}`',
        "prompts.jsonl": 'plain `{"prompt"}`, no id field',
        "prompts.parquet": "the same prompts, in the same order, one `prompt` string column",
        "bad_rows.jsonl": "good and bad rows mixed, see below",
    }
    file_table = "\n".join(
        ["| file | rows | schema |", "|---|---|---|"]
        + [f"| `{name}` | {sizes[name]} | {schema} |" for name, schema in schemas.items()]
    )
    return f"""# Sample prompt datasets

Generated by `scripts/build_samples.py`: edit that script and rerun it, never these files.
`python scripts/build_samples.py --check` verifies that they match a rebuild byte for byte.

All text files are UTF-8 (except the one deliberately invalid line of `bad_rows.jsonl`), one JSON
object per line, `\\n` line ends. Values carry edge cases that must reach the chat template
unchanged: leading/trailing whitespace, blank lines, tabs, CRLF inside values, decomposed
accents (NFD; never normalise), RTL scripts, emoji ZWJ sequences, astral-plane characters, CJK.

{file_table}

`sharegpt.jsonl`: the shape of row `i` cycles with `i % 4`: one human turn; human + gpt;
two full exchanges (human, gpt, human, gpt); human + gpt + human (ends on a human turn).
Rows with `i % 5 == 2` open with a system turn.

`ultrachat.jsonl`: like ultrachat_200k, every row alternates user/assistant and ends with an
assistant turn; `prompt` is the first user message and `prompt_id` its SHA-256 hex digest.
Rows 3, 12 and 25 (0-based) open with a system message, which ultrachat_200k itself never does.

## bad_rows.jsonl

One row per line; every kind of bad row appears exactly once. The file cannot be read by
`datasets.load_dataset("json", ...)` as a whole (lines 2, 4 and 13 break it), so a reader that
keeps going must read it line by line. Each bad row should land in the failure file with a
reason, and the good rows (lines 1, 3, 15) must still be processed. Ids are in the rows; for
lines whose JSON cannot be parsed the failure record can only name the line number.

| line | id | kind | expected handling |
|---|---|---|---|
{bad_table}

Line 12 is the only row in the plain-prompt schema; a reader that fixes the schema from the
first row sees it as missing `conversations`, and fails it either way.

Line 14 is {LONG_PROMPT_CHARS} characters; whether it is over-long depends on the configured
limit. With the tiny-chatml test tokenizer it templates (with the generation prompt) to about
9,900 tokens.

The chat template itself does not reject lines 7 and 11: it renders `<|im_start|>robot` and a
conversation without a user turn without complaint, so eagledata must check roles and turns
before templating. Lines 8-10 make the template raise (`TypeError`; for `null`, transformers
drops the key and Jinja raises `UndefinedError`), which must not reach the template either.
"""


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    share = sharegpt_rows()
    ultra = ultrachat_rows()

    (out / "sharegpt.jsonl").write_bytes(b"".join(_line(r) for r in share))
    json_array = json.dumps(share[:10], ensure_ascii=False, indent=2) + "\n"
    (out / "sharegpt.json").write_text(json_array, encoding="utf-8")
    (out / "ultrachat.jsonl").write_bytes(b"".join(_line(r) for r in ultra))
    (out / "prompts.jsonl").write_bytes(b"".join(_line({"prompt": p}) for p in PROMPTS))
    table = pa.table({"prompt": pa.array(PROMPTS, type=pa.string())})
    pq.write_table(table, out / "prompts.parquet", compression="zstd")
    (out / "bad_rows.jsonl").write_bytes(b"".join(line for *_, line in BAD_ROWS))

    sizes = {
        "sharegpt.jsonl": len(share),
        "sharegpt.json": 10,
        "ultrachat.jsonl": len(ultra),
        "prompts.jsonl": len(PROMPTS),
        "prompts.parquet": len(PROMPTS),
        "bad_rows.jsonl": len(BAD_ROWS),
    }
    (out / "README.md").write_text(readme(BAD_ROWS, sizes), encoding="utf-8")


FILES = (
    "sharegpt.jsonl",
    "sharegpt.json",
    "ultrachat.jsonl",
    "prompts.jsonl",
    "prompts.parquet",
    "bad_rows.jsonl",
    "README.md",
)


def main(argv: list[str] | None = None) -> int:
    return rebuild_main(__doc__.split("\n\n")[0], write, FILES, DEFAULT_OUT, argv)


if __name__ == "__main__":
    sys.exit(main())
