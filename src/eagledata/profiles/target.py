"""The target model a run is for (``--model NAME_OR_DIR``): its folder, and what follows from it.

A target is a local folder holding the model's ``config.json`` and tokenizer files, or a hub name
found in the local Hugging Face cache (never downloaded: a name not in the cache is one line
naming the fix). From it come the settings a run needs of its model, so no config file is edited
for a new one:

* ``tokenizer.name``: the folder itself (its tokenizer and chat template), and the template's
  thinking switch turned on (``enable_thinking`` or ``thinking``, by family) where it has one;
* ``server.expected_model``: what the server must report as its ``model_path`` (the hub name, or
  the folder: ``server/verdict.py`` compares a folder with the server's path sensibly);
* ``server.bf16_kv_bytes_per_token`` and ``server.kv_heads``: one token's bf16 KV cell as SGLang
  lays out its pool (``profiles/kv.py``), which the KV guard checks on every server.

A config file still overrides any of these (``config.loading.load_config``'s ``defaults``), and a
flag overrides the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagledata.errors import ConfigError
from eagledata.profiles.kv import KVModel

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
)
"""Any of these in a model folder is a tokenizer ``AutoTokenizer`` may load."""

THINKING_SWITCHES = ("enable_thinking", "thinking")
"""The chat-template variables that turn a model's thinking on or off, most specific first."""


@dataclass(frozen=True)
class TargetModel:
    """A model folder and what eagledata reads of it."""

    given: str
    """As the user wrote it (a folder or a hub name)."""
    path: Path
    """The folder holding ``config.json`` (a cache snapshot for a hub name)."""
    hub_id: str | None
    config: Mapping[str, Any]
    kv: KVModel

    @property
    def expected_model(self) -> str:
        """What the server reports as ``model_path`` when launched on this model."""
        return self.hub_id if self.hub_id is not None else str(self.path)

    @property
    def text_config(self) -> Mapping[str, Any]:
        """The language model's own config (a multimodal wrapper nests it in ``text_config``)."""
        text = self.config.get("text_config")
        return {**self.config, **text} if isinstance(text, Mapping) else self.config

    @property
    def embedding_rows(self) -> int | None:
        """Rows of the model's embedding (``vocab_size`` of ``config.json``): real models pad it
        past the tokenizer's vocabulary."""
        value = self.text_config.get("vocab_size")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def trust_remote_code(self) -> bool:
        """The tokenizer is custom code (``auto_map`` in ``tokenizer_config.json``), as
        Kimi-K2.5's is: ``AutoTokenizer`` must be allowed to run it, as SGLang must."""
        found = _read_json(self.path / "tokenizer_config.json")
        auto_map = found.get("auto_map") if isinstance(found, dict) else None
        return isinstance(auto_map, dict) and "AutoTokenizer" in auto_map

    @property
    def chat_template(self) -> str | None:
        """The model's own chat template: ``chat_template.jinja`` beside the tokenizer, else
        ``tokenizer_config.json``'s ``chat_template`` (a string, or the ``default`` of a named
        list), as ``transformers`` loads it; None when the model has none."""
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        found = _read_json(self.path / "tokenizer_config.json")
        template = found.get("chat_template") if isinstance(found, dict) else None
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) and template else None

    @property
    def thinking_switch(self) -> str | None:
        """The template variable that turns thinking on or off, by model family: Qwen3 and GLM
        spell it ``enable_thinking``, Kimi-K2.5 and DeepSeek-V3.1 ``thinking``; None when the
        template has no switch (it always or never thinks, or has no think block)."""
        template = self.chat_template
        if template is None:
            return None
        code = " ".join(
            re.sub(r"'[^']*'|\"[^\"]*\"", "''", block)  # names in the template's code, not its text
            for block in re.findall(r"\{%.*?%\}|\{\{.*?\}\}", template, flags=re.DOTALL)
        )
        for switch in THINKING_SWITCHES:
            if re.search(rf"(?<![\w.]){switch}(?!\w)", code):
                return switch
        return None

    def settings(self) -> dict[str, Any]:
        """The settings the model gives a run (dotted keys), beneath the config file's."""
        found: dict[str, Any] = {
            "tokenizer.name": str(self.path),
            "server.expected_model": self.expected_model,
        }
        if self.trust_remote_code:
            found["tokenizer.trust_remote_code"] = True
        switch = self.thinking_switch
        if switch is not None:
            # thinking on: the drafter must learn the reasoning tokens the target writes
            found["tokenizer.chat_template_kwargs"] = {switch: True}
        if self.kv.guard_bytes_per_token is not None:
            found["server.bf16_kv_bytes_per_token"] = self.kv.guard_bytes_per_token
            if self.kv.attention == "mha":
                found["server.kv_heads"] = self.kv.num_kv_heads
        return found


def resolve_target(given: str) -> TargetModel:
    """The model ``given`` names: a local folder, else a hub name in the local cache.
    ``ConfigError``, one line naming the fix, when it is neither or lacks what a run needs."""
    path = Path(given).expanduser()
    hub_id: str | None = None
    if path.is_dir():
        path = path.resolve()
    elif path.exists():
        raise ConfigError(f"--model {given}: not a folder; pass the model's folder or hub name")
    elif _looks_like_path(given):
        raise ConfigError(
            f"--model {given}: no such folder; pass a folder holding the model's config.json "
            "and tokenizer files, or a hub name"
        )
    else:
        path = _cached_snapshot(given)
        hub_id = given
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"--model {given}: {path} has no config.json; pass the folder the model was saved to"
        )
    config = _read_json(config_file)
    if not isinstance(config, dict):
        raise ConfigError(f"--model {given}: {config_file} is not a JSON object")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"--model {given}: {path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
            "save the tokenizer beside the model, or pass --tokenizer DIR"
        )
    kv = KVModel.from_config(config, name=hub_id or path.name)
    return TargetModel(given=given, path=path, hub_id=hub_id, config=config, kv=kv)


def _looks_like_path(given: str) -> bool:
    return given.startswith(("/", ".", "~")) or given.count("/") != 1


def _cached_snapshot(repo_id: str) -> Path:
    """The cached snapshot folder of ``repo_id``, found without the network."""
    fix = (
        f"--model {repo_id}: not a local folder and not in the local Hugging Face cache; "
        f"download it first (huggingface-cli download {repo_id}) or pass the model's folder"
    )
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an id the hub refuses to parse (HFValidationError) is not cached either
        raise ConfigError(fix) from None
    if not isinstance(found, str):  # None, or the cache's "known not to exist" marker
        raise ConfigError(fix)
    return Path(found).parent


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: cannot read it: {error}") from None
