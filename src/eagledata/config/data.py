"""The settings that shape the data: the tokenizer, generation (sampling, turns, dedupe), the
datasets (each with its own generation settings if it says so) and the mixes of several."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from eagledata.config.validation import Strict


class TokenizerSettings(Strict):
    name: str = Field(description="Hub id or local dir for AutoTokenizer; 'bundled:...' for assets")
    revision: str | None = None
    trust_remote_code: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    chat_template: str | None = Field(
        None,
        description="A Jinja chat template used instead of the tokenizer's own (for a model "
        "without one; generate --chat-template FILE reads it from a file)",
    )


Turns = Literal["last", "all"]
"""Which assistant turns of a conversation are regenerated: ``last`` (the answer to the last
user message, earlier answers kept as the dataset has them) or ``all`` (every one, in order,
each prompted with the regenerated answers before it)."""


class GenerationSettings(Strict):
    max_new_tokens: int = Field(4096, ge=1)
    temperature: float = Field(0.6, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    samples_per_prompt: int = Field(1, ge=1, le=64)
    stop_token_ids: list[int] | None = None
    max_prompt_tokens: int | None = Field(None, ge=1)
    turns: Turns = Field(
        "last",
        description="'last': regenerate the last assistant turn; 'all': every assistant turn, "
        "in order, each prompted with the regenerated answers before it",
    )
    dedupe: bool = Field(
        True,
        description="Generate a prompt (the same prompt ids) once: later copies are skipped "
        "with the reason 'duplicate'",
    )
    round: int = Field(
        0,
        ge=0,
        description="Which round of fresh samples of the same prompts this run is (the "
        "library's regenerate(round=N)): it moves every request's sampling_seed",
    )

    @field_validator("top_k")
    @classmethod
    def _top_k_not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("top_k must be -1 (all) or >= 1")
        return value

    def sampling_params(self) -> dict[str, Any]:
        """The ``sampling_params`` sent with every request; ``max_new_tokens`` always explicit.
        From round 1 on they carry the round's first ``sampling_seed``: each sample adds its
        index to it (``run/attempts.py``), so no two (round, sample) pairs share a seed."""
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.round:
            params["sampling_seed"] = self.round * SEEDS_PER_ROUND
        return params


SEEDS_PER_ROUND = 1 << 16
"""The seeds one round spans: more than ``samples_per_prompt`` can ever be (64), so round ``r``'s
sample ``s`` is seeded ``r * SEEDS_PER_ROUND + s`` and round 0 keeps the seeds runs always had."""


Schema = Literal["sharegpt", "messages", "prompt"]
"""The row shapes a dataset may have, by name: the settings' check. Each is read by its entry of
``source/prompts.py``'s ``ROW_SCHEMAS`` (``tests/test_registries.py`` keeps the two in step)."""
SchemaName = Literal["auto", Schema]
"""A dataset's ``schema`` setting: one of them, or ``auto`` (found from the first row's fields)."""


class DatasetSettings(Strict):
    source: str = Field(
        description="A local data file (its types: source/formats.py), hub id, or 'bundled:...'"
    )
    subset: str | None = Field(None, description="Hub config name")
    split: str = "train"
    schema_: SchemaName = Field("auto", alias="schema")
    id_field: str | None = Field(None, description="Column holding a stable id; row index if none")
    prompt_field: str = "prompt"
    system_prompt: str | None = None
    # Generation settings of this dataset alone (None: the run's [generation] / [tokenizer]).
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_new_tokens: int | None = Field(None, ge=1)
    samples_per_prompt: int | None = Field(None, ge=1, le=64)
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Merged over tokenizer.chat_template_kwargs (e.g. thinking on or off)"
    )
    turns: Turns | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def generation(self, base: GenerationSettings) -> GenerationSettings:
        """``base`` with this dataset's own values in place of the run's."""
        own = {
            name: getattr(self, name)
            for name in DATASET_GENERATION_FIELDS
            if getattr(self, name) is not None
        }
        return base.model_copy(update=own) if own else base

    def template_kwargs(self, base: dict[str, Any]) -> dict[str, Any]:
        """The ``chat_template_kwargs`` its prompts are rendered with: the tokenizer's, then its
        own over them."""
        return {**base, **(self.chat_template_kwargs or {})}


DATASET_GENERATION_FIELDS = (
    "temperature",
    "top_p",
    "max_new_tokens",
    "samples_per_prompt",
    "turns",
)
"""The ``[generation]`` settings a ``[datasets.NAME]`` entry may set for itself."""


class MixSettings(Strict):
    """``[mixes.NAME]``: several datasets in one run, each a row count or a share of its rows."""

    seed: int = Field(0, description="Which rows a share or a row count takes")
    datasets: dict[str, int | float] = Field(
        min_length=1,
        description="dataset -> rows (an integer: that many of its rows) or share (a number in "
        "(0, 1]: that fraction of its rows), chosen with the seed",
    )

    @field_validator("datasets")
    @classmethod
    def _amounts(cls, datasets: dict[str, int | float]) -> dict[str, int | float]:
        for name, amount in datasets.items():
            if isinstance(amount, bool):
                raise ValueError(f"{name}: a row count (integer) or a share (0 < share <= 1)")
            if isinstance(amount, int) and amount < 1:
                raise ValueError(f"{name}: a row count must be at least 1, got {amount}")
            if isinstance(amount, float) and not 0.0 < amount <= 1.0:
                raise ValueError(f"{name}: a share must be in (0, 1], got {amount}")
        return datasets
