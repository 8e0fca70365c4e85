"""The wire types of SGLang's native ``/generate``: what eagledata sends (``GenerateRequest``) and
what the server answers (``GenerateAnswer``), as the real server (0.5.23, and the older releases
``profiles/releases.py`` lists) shapes them.

The request holds the fields of SGLang's ``GenerateReqInput`` eagledata uses; the answer the fields
it reads, everything else the server adds (timings, ``weight_versions``, ``cached_tokens_details``)
ignored. The answer is parsed once, from the raw bytes (``GenerateAnswer.model_validate_json``:
one pass in pydantic-core, no dict built first); ``responses.read_generate_answer`` turns a parse
that fails into the contract error naming what is wrong.

Strict where the token contract lives: the counts and every id are JSON integers (never a float,
a string or a boolean). Lenient where a field is provenance, kept but never trusted
(``Kept``): ``cached_tokens``, ``e2e_latency``, ``weight_version``, the retraction and verify
counts and the matched stop token read as None when they have the wrong type, as the records
store them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    SkipValidation,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)
from pydantic_core import core_schema

OR_NONE = GetPydanticSchema(
    lambda source, handler: core_schema.with_default_schema(
        handler(source), default=None, on_error="default"
    )
)
"""A value of another type reads as None, inside pydantic-core (a Python validator per field
cost ~1 us an answer)."""
KeptInt = Annotated[StrictInt | None, OR_NONE]
KeptFloat = Annotated[StrictFloat | None, OR_NONE]
"""A JSON number (an int reads as a float), never a boolean; anything else None."""
KeptStr = Annotated[StrictStr | None, OR_NONE]
KeptToken = Annotated[StrictInt | StrictStr | None, OR_NONE]
"""A stop SGLang matched: a token id, or the stop string."""


# --- the request -------------------------------------------------------------------------------


class SamplingParams(BaseModel):
    """``sampling_params``: the fields eagledata sends and reads back typed; any other SGLang
    sampling field (``repetition_penalty``, ``stop``...) passes through as given."""

    model_config = ConfigDict(frozen=True, extra="allow")

    max_new_tokens: StrictInt | None = Field(None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool | None = None
    sampling_seed: StrictInt | None = None

    def wire(self) -> dict[str, Any]:
        """The fields that were set, and the others given, as sent."""
        given = self.__pydantic_fields_set__
        wire = {name: value for name, value in self.__dict__.items() if name in given}
        if self.__pydantic_extra__:
            wire.update(self.__pydantic_extra__)
        return wire


class GenerateRequest(BaseModel):
    """One ``/generate`` request (SGLang's ``GenerateReqInput``, the fields eagledata uses):
    always token ids, never text, one prompt per request, never streamed.

    Sent without its None fields (``body``), so every release reads it as before."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_ids: SkipValidation[list[int]]
    """Not checked id by id: eagledata's own tokenizer made them (the type checker holds it),
    and checking 300 of them doubled the client's own cost of a request."""
    sampling_params: SamplingParams
    rid: StrictStr | None = None
    return_logprob: StrictBool | None = None
    logprob_start_len: StrictInt | None = None
    top_logprobs_num: StrictInt | None = None
    data_parallel_rank: StrictInt | None = None
    """The DP rank pin 0.5.9 knows (0.5.15.post1 drops it silently; 0.5.23 takes it as an
    alias of ``routed_dp_rank``)."""
    routed_dp_rank: StrictInt | None = None
    """The DP rank pin of 0.5.15.post1 on."""

    @property
    def max_new_tokens(self) -> int | None:
        return self.sampling_params.max_new_tokens

    @property
    def rank(self) -> int | None:
        """The DP rank it is pinned to, by either field; None: not pinned."""
        return self.routed_dp_rank if self.routed_dp_rank is not None else self.data_parallel_rank

    def pinned(self, fields: tuple[str, ...], rank: int) -> GenerateRequest:
        """Pinned to DP rank ``rank`` by each of ``fields``."""
        return self.model_copy(update=dict.fromkeys(fields, rank))

    def body(self) -> bytes:
        """The JSON body: the fields that are not None (an unset field is the server's
        default, never ``null``). Written by orjson from the validated values: pydantic's own
        serializer takes ~4x as long for a 300-token prompt, on every request."""
        body = {name: value for name, value in self.__dict__.items() if value is not None}
        body["sampling_params"] = self.sampling_params.wire()
        return orjson.dumps(body)


# --- the answer --------------------------------------------------------------------------------


class FinishStop(BaseModel):
    """Stopped by a stop token (``matched`` its id), a stop string, or EOS."""

    model_config = ConfigDict(frozen=True)

    type: Literal["stop"]
    matched: KeptToken = None


class FinishLength(BaseModel):
    """Cut at ``max_new_tokens`` (``length``)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["length"]
    length: KeptInt = None


class FinishAbort(BaseModel):
    """Aborted by the server, yet answered with HTTP 200: a failure to retry, never a record."""

    model_config = ConfigDict(frozen=True)

    type: Literal["abort"]
    message: Any = None
    status_code: Any = None
    err_type: Any = None


FinishReason = Annotated[FinishStop | FinishLength | FinishAbort, Field(discriminator="type")]

LogprobEntry = tuple[float | None, StrictInt, StrictStr | None]
"""``[logprob, token_id, text]``: the logprob is null for the first input position, the text
unless ``return_text_in_logprobs``."""


class MetaInfo(BaseModel):
    """``meta_info``: the counts the token contract checks, the finish reason, provenance, and
    logprobs when asked for."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: StrictInt
    completion_tokens: StrictInt
    finish_reason: FinishReason
    cached_tokens: KeptInt = None
    e2e_latency: KeptFloat = None
    weight_version: KeptStr = None
    spec_verify_ct: KeptInt = None
    """Speculative verify steps: only with a speculative algorithm and at least one step."""
    total_retractions: KeptInt = None
    """Times the request was retracted: 0.5.9's name."""
    num_retractions: KeptInt = None
    """The same count: the name of later releases."""
    input_token_logprobs: list[LogprobEntry] | None = None
    output_token_logprobs: list[LogprobEntry] | None = None
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    output_top_logprobs: list[list[LogprobEntry] | None] | None = None


class GenerateAnswer(BaseModel):
    """One ``/generate`` answer of a single, unstreamed request (HTTP 200)."""

    model_config = ConfigDict(frozen=True)

    output_ids: list[StrictInt]
    meta_info: MetaInfo
    text: KeptStr = None
