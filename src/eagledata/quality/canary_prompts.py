"""The canary's prompts, taken from the run's own datasets and templated exactly as production."""

from __future__ import annotations

from eagledata.config import AppConfig
from eagledata.source.mix import Mix
from eagledata.source.tokenization import LengthLimit, PromptTokenizer
from eagledata.source.workitem import WorkItem
from eagledata.source.workplan import WorkPlan


def canary_prompts(
    config: AppConfig, mix: Mix, tokenizer: PromptTokenizer, limit: LengthLimit
) -> list[list[int]]:
    """The canary's prompts: the first distinct prompts of the run's own datasets (in the order
    the plan takes them; a conversation's first turn), templated exactly as production, short
    enough for prompt + reference to fit."""
    settings = config.canary
    cap = min(limit.max_prompt_tokens or settings.max_prompt_tokens, settings.max_prompt_tokens)
    plan = WorkPlan(
        mix,
        generation=config.generation.model_copy(update={"dedupe": False}),
        template_kwargs=config.tokenizer.chat_template_kwargs,
        row_limit=config.run.limit,
        tokenizer=tokenizer,
        limit=LengthLimit(cap, "canary.max_prompt_tokens"),
        done=set(),
    )
    prompts: dict[tuple[int, ...], None] = {}
    for entry in plan:
        if isinstance(entry, WorkItem) and len(entry.input_ids) >= 2:
            prompts[tuple(entry.input_ids)] = None
            if len(prompts) >= settings.prompts:
                break
    return [list(prompt) for prompt in prompts]
