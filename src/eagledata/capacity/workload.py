"""What a generation job asks of the server: prompt lengths, answer lengths, sample count."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from eagledata.errors import ConfigError
from eagledata.rundir.percentile import percentile_of_sorted


class Workload(BaseModel):
    """What a generation job asks of the server.

    Build it from a sample of templated prompt lengths with :meth:`from_prompt_lengths`.
    ``mean_output_tokens`` is the expected answer length (for thinking models often far below
    ``max_new_tokens``); when unknown it is taken as ``max_new_tokens`` (a pessimistic plan).
    ``slack_tokens`` covers admission reservations and uneven progress: with the default 150 a
    300-token prompt and a 4,500-token answer hold 2,700 tokens per running request, what both
    reference runs showed (116k/42.5 and 376k/142).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_prompts: Annotated[int, Field(gt=0)]
    samples_per_prompt: Annotated[int, Field(gt=0)] = 1
    mean_prompt_tokens: Annotated[float, Field(ge=0)]
    p90_prompt_tokens: Annotated[float, Field(ge=0)] | None = None
    max_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    max_new_tokens: Annotated[int, Field(gt=0)]
    mean_output_tokens: Annotated[float, Field(gt=0)]
    mean_output_assumed: bool = False
    slack_tokens: Annotated[int, Field(ge=0)] = 150
    prompt_length_sample: tuple[int, ...] = Field(default=(), repr=False)

    @classmethod
    def from_prompt_lengths(
        cls,
        prompt_lengths: Sequence[int],
        *,
        max_new_tokens: int,
        mean_output_tokens: float | None = None,
        num_prompts: int | None = None,
        samples_per_prompt: int = 1,
        slack_tokens: int = 150,
    ) -> Workload:
        """A workload from a sample of prompt token lengths (``num_prompts`` defaults to its
        size)."""
        lengths = sorted(int(n) for n in prompt_lengths)
        if not lengths:
            raise ConfigError("workload: the prompt length sample is empty")
        p90 = percentile_of_sorted(lengths, 0.9)  # nearest rank, as status says it
        return cls(
            num_prompts=num_prompts if num_prompts is not None else len(lengths),
            samples_per_prompt=samples_per_prompt,
            mean_prompt_tokens=sum(lengths) / len(lengths),
            p90_prompt_tokens=p90,
            max_prompt_tokens=lengths[-1],
            max_new_tokens=max_new_tokens,
            mean_output_tokens=(
                mean_output_tokens if mean_output_tokens is not None else max_new_tokens
            ),
            mean_output_assumed=mean_output_tokens is None,
            slack_tokens=slack_tokens,
            prompt_length_sample=tuple(lengths),
        )

    @property
    def tokens_per_running_request(self) -> float:
        """Average KV tokens a running request holds: its prompt plus half its answer."""
        return self.mean_prompt_tokens + 0.5 * self.mean_output_tokens + self.slack_tokens

    @property
    def total_output_tokens(self) -> float:
        return self.num_prompts * self.samples_per_prompt * self.mean_output_tokens

    def fraction_over(self, context_length: int) -> float | None:
        """Share of sampled prompts that cannot get ``max_new_tokens`` within the context."""
        if not self.prompt_length_sample:
            return None
        limit = context_length - self.max_new_tokens
        over = sum(1 for n in self.prompt_length_sample if n > limit)
        return over / len(self.prompt_length_sample)


REFERENCE_WORKLOAD = Workload(
    num_prompts=88_000,
    mean_prompt_tokens=300,
    max_new_tokens=16_384,
    mean_output_tokens=4_500,
)
"""The reference job: ~88,000 prompts, ~4,500-token answers (396M output tokens). The 300-token
mean prompt is an assumption that, with the default slack, matches the 2,700 tokens per running
request both reference runs showed."""
