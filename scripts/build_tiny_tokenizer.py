"""Build the tiny offline ChatML tokenizer shipped in ``assets/tokenizer/tiny-chatml``.

``--think`` builds its thinking variant, ``assets/tokenizer/tiny-chatml-think``: the same
vocabulary, and a chat template like a thinking model's (the generation prompt opens ``<think>``,
as Kimi-K2.5's does; an earlier answer's ``reasoning_content`` is rendered inside
``<think></think>``, or dropped with ``keep_thinking=false``, as Kimi-K2.5 drops it).

The tokenizer is a byte-level BPE (GPT-2 / Qwen style) trained with the ``tokenizers`` library on
the built-in multilingual corpus below, so any unicode text round-trips through byte fallback.
The output directory loads with ``transformers.AutoTokenizer.from_pretrained(DIR)`` exactly like a
real model's tokenizer, chat template included. No network, no model hub; runs in about a second.

The output is deterministic: every file is written with sorted, fixed formatting, so rebuilding
must reproduce the shipped copy byte for byte (``--check`` verifies that).

Usage::

    python scripts/build_tiny_tokenizer.py [OUT_DIR] [--check]
"""

# ruff: noqa: RUF001  (the training corpus is deliberately multilingual)

from __future__ import annotations

import json
import sys
from pathlib import Path

from _rebuild import rebuild_main  # scripts/_rebuild.py, beside this file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

DEFAULT_OUT = (
    Path(__file__).resolve().parent.parent
    / "src"
    / "eagledata"
    / "assets"
    / "tokenizer"
    / "tiny-chatml"
)
VOCAB_SIZE = 3000

# Ids 0..4 in this order.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ChatML, like Qwen. ``enable_thinking=False`` appends an empty think block to the generation
# prompt, like Qwen3; ``True`` or undefined leaves the bare ``<|im_start|>assistant\n``.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# The thinking variant. ``enable_thinking=False`` closes an empty think block in the generation
# prompt (thinking off); ``keep_thinking=False`` renders earlier answers' thinking as an empty
# block (Kimi-K2.5's template drops it).
THINK_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message['reasoning_content'] is defined and message['reasoning_content'] is string -%}"
    "{%- if keep_thinking is defined and keep_thinking is false -%}"
    "{{- '<think></think>' -}}"
    "{%- else -%}"
    "{{- '<think>' + message['reasoning_content'] + '</think>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{{- message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think></think>' -}}"
    "{%- else -%}"
    "{{- '<think>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
THINK_OUT = DEFAULT_OUT.with_name("tiny-chatml-think")

# Training text. Variety matters more than volume: it decides which merges exist, not whether
# text can be encoded (byte-level BPE encodes every byte sequence).
CORPUS = """
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
You are a helpful assistant. Please answer the question below carefully and concisely.
Explain how a transformer language model predicts the next token, step by step.
Write a short poem about the sea, the wind, and a lighthouse keeper who cannot sleep.
What is the capital of France? The capital of France is Paris, on the river Seine.
Summarize the following article in three sentences, keeping every number exactly as written.
Translate this sentence into German: "The weather is nice today, let's go for a walk."
Can you help me debug this Python function? It raises a KeyError when the dictionary is empty.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(i, fibonacci(i))

import json
with open("data.jsonl", encoding="utf-8") as handle:
    rows = [json.loads(line) for line in handle if line.strip()]
SELECT name, COUNT(*) FROM users WHERE created_at > '2024-01-01' GROUP BY name ORDER BY 2 DESC;
{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi! How can I help?"}
<div class="card"><h1>Title</h1><p>Some paragraph text &amp; an entity.</p></div>
https://example.com/path/to/page?query=value&other=42#section
The year 2024 had 366 days; 3.14159 is pi, 2.71828 is e, and 1,000,000 is one million.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 42 50 64 100 128 256 512 1024.
First, second, third. Yes, no, maybe. Thanks! Sorry? Great... OK: done; next - item (note) [list].
Let me think about this. First I need to understand the problem, then check edge cases.
The answer is 42 because six times seven equals forty-two, which we can verify by division.
Machine learning models are trained on large datasets with gradient descent and backpropagation.
Speculative decoding uses a small draft model to propose tokens that a large model verifies.
The hidden states of the target model are saved together with the generated token ids.
Once upon a time, in a kingdom far away, there lived a clever girl who loved mathematics.
The mitochondria is the powerhouse of the cell. Photosynthesis converts light into energy.
Water boils at 100 degrees Celsius at sea level; it freezes at 0 degrees Celsius.
Le café est délicieux, n'est-ce pas ? Où est la bibliothèque ? Très bien, merci beaucoup.
Élève, garçon, façade, naïve, cœur, Noël, où, à bientôt, déjà vu, crème brûlée.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München, schöne Straße.
Ärger, Übung, Öl, Fußgänger, Mädchen, größer, Käse, Brötchen, Frühstück, Gemütlichkeit.
El niño comió una manzana. ¿Dónde está la estación? ¡Qué bueno! Mañana vamos a España.
Português: não, coração, ação, informação, você está bem? Obrigado pela atenção.
Italiano: perché, città, più, così, caffè, università, è già tardi, arrivederci.
Polski: zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň úpěl ďábelské ódy.
Türkçe: ğüşıöç, İstanbul, çok güzel, teşekkür ederim. Română: mulțumesc, școală, țară.
Tiếng Việt: xin chào, cảm ơn, tôi không biết, Việt Nam, phở bò rất ngon.
Ελληνικά: Καλημέρα κόσμε, ευχαριστώ πολύ, η γλώσσα μου είναι ελληνική.
Русский: Привет, мир! Как дела? Спасибо, всё хорошо. Москва, Санкт-Петербург.
Українська: Доброго дня, дякую, будь ласка, Київ, їжак, ґанок, європейський.
日本語: こんにちは世界。今日はいい天気ですね。東京は日本の首都です。ありがとうございます。
カタカナ: コンピューター、プログラム、データ、モデル、トークン、テスト、サーバー。
中文：你好，世界！今天天气很好。北京是中国的首都。谢谢你的帮助。我们一起学习吧。
繁體中文：歡迎光臨，請問您需要什麼幫助？資料集、模型、訓練、推理、語言。
한국어: 안녕하세요, 세계! 감사합니다. 서울은 한국의 수도입니다. 좋은 하루 되세요.
العربية: مرحبا بالعالم، شكرا جزيلا، كيف حالك؟ اللغة العربية جميلة.
עברית: שלום עולם, תודה רבה, מה שלומך? ירושלים.
हिन्दी: नमस्ते दुनिया, धन्यवाद, आप कैसे हैं? भारत एक बड़ा देश है।
ไทย: สวัสดีชาวโลก ขอบคุณมาก กรุงเทพมหานคร
Emoji: 😀 😂 🎉 🚀 ❤️ 👍 🔥 ✨ 🤖 🧠 🌍 🍕 👨‍👩‍👧‍👦 🏳️‍🌈 👋🏽 ✅ ❌ ⚠️ 💡 📚
Symbols: © ® ™ € £ ¥ ° ± × ÷ ≤ ≥ ≠ ∞ √ ∑ ∫ π λ μ Ω → ← ↑ ↓ … — – « » „ " ' •
Math: e^{i\\pi} + 1 = 0, \\frac{a}{b}, x_1 + x_2 = \\sqrt{y}, f(x) = ax^2 + bx + c.
Combining accents: e\u0301 a\u0300 o\u0308 n\u0303 c\u0327, and precomposed é à ö ñ ç.
Whitespace:\ttabs\tand  double  spaces,   trailing spaces,
blank lines,

and indentation:
    four spaces
        eight spaces
"""


def _corpus() -> list[str]:
    """The training lines: the corpus plus a deterministic spread of words, numbers and code."""
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    words = sorted({word for line in lines for word in line.split()})
    # Pair up neighbouring words so merges across common fragments get enough counts.
    lines += [f"{words[i]} {words[(i * 7 + 3) % len(words)]}" for i in range(len(words))]
    lines += [" ".join(str(n * n) for n in range(k, k + 12)) for k in range(0, 240, 12)]
    lines += [f"    x_{i} = items[{i}] * {i + 1}  # step {i}" for i in range(40)]
    return lines


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def _dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


def write(out: Path, template: str = CHAT_TEMPLATE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    assert list(ids.values()) == list(range(len(SPECIAL_TOKENS))), ids

    # Compact JSON: the merges list dominates the size and nobody reviews it by eye.
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=False) + "\n", encoding="utf-8")

    added_tokens_decoder = {
        str(ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        "bos_token": BOS_TOKEN,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(_dump(config), encoding="utf-8")

    special_tokens_map = {
        "additional_special_tokens": config["additional_special_tokens"],
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
    }
    (out / "special_tokens_map.json").write_text(_dump(special_tokens_map), encoding="utf-8")


FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_think(out: Path) -> None:
    write(out, THINK_TEMPLATE)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--think" in args:
        args.remove("--think")
        return rebuild_main(__doc__.split("\n\n")[0], write_think, FILES, THINK_OUT, args)
    return rebuild_main(__doc__.split("\n\n")[0], write, FILES, DEFAULT_OUT, args)


if __name__ == "__main__":
    sys.exit(main())
