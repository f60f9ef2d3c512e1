"""Request and response models: what the server accepts and answers, and its OpenAPI document.

Requests are validated strictly (a string is not a number, a number is not a boolean, NaN and infinity
are not numbers) and an unknown field is refused as OpenAI refuses it ("Unrecognized request
argument"), with the field it most resembles (``temprature``: did you mean ``temperature``?): a field
is honoured or refused, never ignored. OpenAI fields this server does not implement (`UNSUPPORTED`)
are accepted only with their "off" value (``null``, ``"store": false``...). Every optional field may
also be ``null``, meaning its default. Ranges that depend on the model (token ids
against the vocabulary, prompt lengths against the context) are checked when a request runs.
"""

from __future__ import annotations

import difflib
import json
import sys
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from inferno.options import MAX_ABS_BIAS, MAX_ABS_PENALTY, MAX_LOGPROBS, MAX_STOP_STRINGS

#: n: choices per prompt. Each takes a KV slot, and the n of one prompt run at once.
MAX_N = 16



def _integral(value: Any) -> Any:
    # JSON has one number type: 2.0 is the integer 2 (as JSON Schema's "integer" has it), 2.5 is not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: After an int's constraints: an integer as JSON has it (2 or 2.0, not 2.5, "2" or true). After, not
#: before them: else the JSON schema would lose them.
JSON_INT = BeforeValidator(_integral)

def _float_sized(value: Any) -> Any:
    # JSON's integer 1e400 written out in digits is a number, but no float holds it: say so, not "not a
    # valid number".
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        raise PydanticCustomError("finite_number", "Input should be a finite number (this one overflows a "
                                  "64-bit float)")
    return value


#: After a float's constraints (as JSON_INT): an integer too large for a float is refused as such.
JSON_FLOAT = BeforeValidator(_float_sized)

TokenId = Annotated[int, Field(ge=0), JSON_INT]
Temperature = Annotated[float, Field(ge=0, le=2), JSON_FLOAT]
TopP = Annotated[float, Field(gt=0, le=1), JSON_FLOAT]
Penalty = Annotated[float, Field(ge=-MAX_ABS_PENALTY, le=MAX_ABS_PENALTY), JSON_FLOAT]
RepetitionPenalty = Annotated[float, Field(gt=0), JSON_FLOAT]
Bias = Annotated[float, Field(ge=-MAX_ABS_BIAS, le=MAX_ABS_BIAS), JSON_FLOAT]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
StopString = Annotated[str, Field(min_length=1)]
BiasKey = Annotated[str, StringConstraints(pattern=r"^[0-9]+$")]
Texts = Annotated[list[str], Field(min_length=1)]
Prompt = str | Texts | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]

_PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def _stop_rule(value: Any, handler: Any) -> Any:
    # A union reports one error per branch, under pydantic's names for them: say the rule once.
    try:
        return handler(value)
    except ValidationError:
        rule = f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings"
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            rule += f"; got {len(value)} strings"
        elif isinstance(value, list):
            bad = next((k for k, s in enumerate(value) if not isinstance(s, str) or not s), None)
            rule += f"; stop[{bad}] is {'empty' if value[bad] == '' else 'not a string'}"
        raise PydanticCustomError("stop_rule", rule) from None


def _bias_keys(value: Any, handler: Any) -> Any:
    # A key that is not a token id in digits: pydantic would quote its regular expression.
    try:
        return handler(value)
    except ValidationError as exc:
        bad = next((e["loc"][0] for e in exc.errors() if e["loc"][-1:] == ("[key]",)), None)
        if bad is None:
            raise
        raise PydanticCustomError("bias_key", "keys must be token ids in decimal digits, got {key}",
                                  {"key": repr(bad)}) from None


#: OpenAI request fields this server does not implement, with the values that ask for nothing (accepted,
#: as they change nothing); any other value is refused as not supported.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    # chat completions
    "audio": (None,), "modalities": (None, ["text"]), "functions": (None, []),
    "function_call": (None, "none"),
    "tool_choice": (None, "none"), "parallel_tool_calls": (None, True, False), "prediction": (None,),
    "metadata": (None, {}), "store": (None, False), "service_tier": (None, "auto", "default"),
    "reasoning_effort": (None,), "web_search_options": (None,), "verbosity": (None,),
    # a chat message (as a client sends back an earlier reply)
    "tool_calls": (None, []), "tool_call_id": (None,), "refusal": (None,),
}


def _unknown_field(name: str, value: Any, fields: list[str]) -> InitErrorDetails | None:
    """The error for a field that is not one of `fields` (None: an OpenAI field sent "off")."""
    if name in UNSUPPORTED:
        if any(value == ok and type(value) is type(ok) for ok in UNSUPPORTED[name]):
            return None
        ok = " or ".join(json.dumps(v) for v in UNSUPPORTED[name])
        error = PydanticCustomError("unsupported_field", "is an OpenAI field this server does not support "
                                    "(only {ok})", {"ok": ok})
    else:
        close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f" (the fields: {', '.join(fields)})"
        error = PydanticCustomError("unknown_field", "is not a field of this request{hint}", {"hint": hint})
    return InitErrorDetails(type=error, loc=(name,), input=value)


class _Request(BaseModel):
    """A request's object: strict types, and no field the model does not have (`_unknown_field`)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic says what the object must be
        fields = [f.alias or name for name, f in cls.model_fields.items()]  # as the client spells them
        unknown = [k for k in value if k not in fields]
        if not unknown:
            return value
        errors = [e for e in (_unknown_field(k, value[k], fields) for k in unknown) if e is not None]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return {k: v for k, v in value.items() if k not in unknown}


class StreamOptions(_Request):
    include_usage: bool | None = Field(None, description="Send a last chunk with the usage and no choices.")


# ---------------------------------------------------------------------------------- structured output
# The request's constraint (issue #42; see docs/structured-output.md): OpenAI's `response_format`,
# vLLM's `structured_outputs`, or vLLM's older `guided_*` names (honoured, never ignored). At most one
# per request (`inferno.serve.constraints` builds the `Constraint` and says which fields clash).

JsonSchema = dict[str, Any]
Choices = Annotated[list[str], Field(min_length=1)]


class JsonSchemaFormat(_Request):
    """``response_format.json_schema``: OpenAI's named schema."""

    name: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="The schema's name (OpenAI requires one); a label only.")
    description: str | None = Field(None, description="Accepted; a label only (the model is not told).")
    schema_: JsonSchema = Field(alias="schema", description="A JSON Schema: every choice's text is a JSON "
                                "document it validates.")
    strict: bool | None = Field(None, description="Accepted; the schema is enforced either way (false "
                                "does not loosen it).")


class TextFormat(_Request):
    type: Literal["text"]


class JsonObjectFormat(_Request):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Request):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat,
                           Field(discriminator="type")]
_FORMAT_TYPES = '"text", "json_object" or "json_schema"'


class StructuredOutputs(_Request):
    """vLLM's ``structured_outputs``: exactly one of its fields."""

    json_: JsonSchema | str | None = Field(None, alias="json", description="A JSON Schema (an object, or "
                                           "its JSON text).")
    regex: str | None = Field(None, description="A regular expression the whole text matches.")
    choice: Choices | None = Field(None, description="The text is exactly one of these strings.")
    grammar: str | None = Field(None, description="A Lark grammar (llguidance's dialect) the text matches.")
    json_object: bool | None = Field(None, description="true: the text is a JSON object.")


class GenerationRequest(_Request):
    """The fields that completions and chat completions share: sampling, stops, penalties, streaming."""

    model: str | None = Field(None, description="The model's id as /v1/models lists it (or an alias, see "
                              "docs/serving.md); another is a 404 model_not_found. Default: the one model.")
    temperature: Temperature | None = Field(None, description="Default 1; 0: greedy.")
    top_p: TopP | None = Field(None, description="Nucleus mass (1, off).")
    top_k: Annotated[int, Field(ge=-1), JSON_INT] | None = Field(
        None, description="Extension: keep the k most likely tokens (0 or -1: off, the default).")
    n: Annotated[int, Field(ge=1, le=MAX_N), JSON_INT] | None = Field(
        None, description="Choices per prompt (default 1); they share the prompt's prefill.")
    seed: Annotated[int, Field(ge=0), JSON_INT] | None = Field(
        None, description="Choice j of each prompt samples with seed + j (none: fresh randomness).")
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="Text that ends a choice; it is not part of the text.")
    stop_token_ids: list[TokenId] | None = Field(None, description="Extension: token ids that end a choice.")
    stream: bool | None = Field(None, description="Send Server-Sent Events, a chunk per token.")
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = Field(
        None, description="Extension: Hugging Face's repetition penalty (1: off, the default).")
    logit_bias: dict[BiasKey, Bias] | None = Field(
        None, description="Token id (as a string) to a bias added to its logit; -100 bans it.")
    ignore_eos: bool | None = Field(None, description="Extension: keep generating past <|endoftext|>.")
    user: str | None = Field(None, description="Accepted and ignored.")
    response_format: ResponseFormat | None = Field(
        None, description='{"type": "text"} (the default), {"type": "json_object"}: a JSON object, or '
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}: JSON that validates '
        "against the schema. At most one of response_format, structured_outputs and guided_*.")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM's constraint: exactly one of json, regex, choice, grammar, json_object.")
    guided_json: JsonSchema | str | None = Field(None, description="vLLM's older name of "
                                                 "structured_outputs.json (honoured).")
    guided_regex: str | None = Field(None, description="vLLM's older name of structured_outputs.regex.")
    guided_choice: Choices | None = Field(None, description="vLLM's older name of "
                                          "structured_outputs.choice.")
    guided_grammar: str | None = Field(None, description="vLLM's older name of "
                                       "structured_outputs.grammar.")

    @field_validator("response_format", mode="wrap")
    @classmethod
    def _format_types(cls, value: Any, handler: Any) -> Any:
        # A tagged union says "Input tag ... does not match any of the expected tags": say the rule.
        if isinstance(value, dict) and value.get("type") not in ("text", "json_object", "json_schema"):
            got = "no type" if "type" not in value else f"type {json.dumps(value['type'])}"
            raise PydanticCustomError("response_format_type", "must have a type of {types}; got {got}",
                                      {"types": _FORMAT_TYPES, "got": got})
        return handler(value)

    @field_validator("stop", mode="wrap")
    @classmethod
    def _stop_rule(cls, value: Any, handler: Any) -> Any:
        return _stop_rule(value, handler)

    @field_validator("logit_bias", mode="wrap")
    @classmethod
    def _bias_keys(cls, value: Any, handler: Any) -> Any:
        return _bias_keys(value, handler)


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: OpenAI's fields, vLLM's meaning where OpenAI leaves room, and the
    extensions ``top_k``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids`` and
    ``return_token_ids``."""

    prompt: Prompt = Field(
        "", description=f"{_PROMPT_FORMS[0].upper()}{_PROMPT_FORMS[1:]}: one choice (or n) per prompt. "
        "An empty string is <|endoftext|> (unconditional text); <|endoftext|> in text is the special token.")
    max_tokens: Annotated[int, Field(ge=0), JSON_INT] | None = Field(
        None, description="New tokens per choice (default 16; 0 only with echo). Clamped to the context: "
        "a choice that reaches it ends with finish_reason \"length\".")
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), JSON_INT] | None = Field(
        None, description="Log-probability of each token and of the N most likely alternatives.")
    echo: bool | None = Field(None, description="Return the prompt before the new text (its tokens' "
                              "logprobs too, as scored by the model; the first has none).")
    return_token_ids: bool | None = Field(
        None, description="Extension: with logprobs, also return each token's id (logprobs.token_ids) and "
        "the ids of its top_logprobs, in their order (logprobs.top_token_ids). Default false.")
    best_of: Annotated[int, Field(ge=1, le=1), JSON_INT] | None = Field(
        None, description="Not supported: only null or 1.")
    suffix: Annotated[str, Field(max_length=0)] | None = Field(
        None, description="Not supported: only null or empty.")

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_prompt_error(cls, value: Any, handler: Any) -> Any:
        # A union reports one error per branch; say once what a prompt may be.
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("prompt_type", f"must be {_PROMPT_FORMS} (none empty)") from None

    @field_validator("best_of", mode="wrap")
    @classmethod
    def _no_best_of(cls, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("unsupported", "is not supported (only null or 1); use n for several "
                                      "choices") from None

    @field_validator("suffix", mode="wrap")
    @classmethod
    def _no_suffix(cls, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("unsupported", "is not supported (only null or empty)") from None


class TextPart(_Request):
    """A part of a message's content: only text (GPT-2 reads nothing else)."""

    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(
        None, description="The text, or a list of text parts (joined); null only for an assistant turn.")
    name: str | None = Field(None, description="Accepted; the default template does not show it.")

    @field_validator("content", mode="wrap")
    @classmethod
    def _content_forms(cls, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("content_type", "must be a string or a list of text parts "
                                      '({"type": "text", "text": ...}); GPT-2 reads only text') from None


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``: OpenAI's chat fields over the same generation as completions. The
    messages become one prompt through the chat template (see `inferno.chat_template`)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1), JSON_INT] | None = Field(
        None, description="Deprecated by OpenAI for max_completion_tokens, which wins when both are given.")
    max_completion_tokens: Annotated[int, Field(ge=1), JSON_INT] | None = Field(
        None, description="New tokens per choice (default: up to the context's end).")
    logprobs: bool | None = Field(None, description="Return each new token's log-probability.")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), JSON_INT] | None = Field(
        None, description="With logprobs: the N most likely alternatives of each token.")
    tools: list[Any] | None = Field(None, description="Not supported: only null or empty.")

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: Any) -> Any:
        if value:
            raise PydanticCustomError("unsupported", "is not supported: GPT-2 has no tool calling")
        return value


class TokenizeRequest(_Request):
    """``POST /tokenize``: ``content`` (llama.cpp's server) or ``prompt`` (vLLM's)."""

    content: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = Field(None, description="true: the tokenizer's special tokens around "
                                            "the text (a BOS; GPT-2 has none); default false, as "
                                            "/v1/completions reads a prompt (vLLM's name).")
    add_special: bool | None = Field(None, description="The same (llama.cpp's name).")
    parse_special: bool | None = Field(None, description="<|endoftext|> in the text is the special token "
                                       "(default true); false: it is plain text.")


class DetokenizeRequest(_Request):
    tokens: list[TokenId]


#: /v1/inspect: the most attention weights one response carries (layers × heads × T × T); a larger
#: request is a 400 that says to ask for fewer layers or heads.
MAX_INSPECT_WEIGHTS = 1 << 24
#: /v1/inspect: the most tokens of the logit lens per position.
MAX_INSPECT_TOP = 20
LayerOrHead = Annotated[int, Field(ge=0), JSON_INT]


class InspectRequest(_Request):
    """``POST /v1/inspect`` (an extension): the attention weights and the logit lens of one prompt."""

    prompt: str | TokenIds = Field(description="Text (<|endoftext|> is the special token; empty: "
                                   "<|endoftext|>) or token ids: one prompt, at most the context long.")
    layers: Annotated[list[LayerOrHead], Field(min_length=1)] | None = Field(
        None, description="Blocks whose attention is returned (0-based; default all).")
    heads: Annotated[list[LayerOrHead], Field(min_length=1)] | None = Field(
        None, description="Heads whose attention is returned (default all).")
    positions: Annotated[list[LayerOrHead], Field(min_length=1)] | None = Field(
        None, description="Positions whose logit lens is returned (default all; each costs an LM head "
        "per layer).")
    top: Annotated[int, Field(ge=1, le=MAX_INSPECT_TOP), JSON_INT] | None = Field(
        None, description="Tokens of the logit lens per position and layer (default 5).")


# -------------------------------------------------------------------------------------------- responses


class LensEntry(BaseModel):
    token: str
    token_id: int
    probability: float


class InspectResponse(BaseModel):
    """`attention[a][b][i][j]`: block ``layers[a]``, head ``heads[b]``, query i, key j (0 for j > i),
    rounded to 4 decimals. `logit_lens[l][k]`: layer l (0: the embedding; l: after block l - 1; the
    last: the model's own next-token distribution) at position ``positions[k]``, most likely first."""

    object: Literal["inspection"] = "inspection"
    model: str
    tokens: list[str]
    token_ids: list[int]
    layers: list[int]
    heads: list[int]
    positions: list[int]
    attention: list[list[list[list[float]]]]
    logit_lens: list[list[list[LensEntry]]]

#: "abort": ended by the server (shut down past --grace-seconds), as vLLM says it; no OpenAI client
#: breaks on it (OpenAI's own are stop, length, content_filter, tool_calls).
FinishReason = Literal["stop", "length", "abort"]


class CompletionLogprobs(BaseModel):
    """Per token: its text, log-probability (null for the first prompt token of an echo), the most likely
    alternatives (text → logprob; null where the logprob is) and where its text starts in the choice's
    text. A token whose bytes are not UTF-8 on their own is written ``bytes:\\xNN...``. With the
    ``return_token_ids`` extension also each token's id and the ids of its top_logprobs, in their order
    (absent otherwise), and with a constraint too, which tokens it forced. A constrained choice's logprobs
    are after the constraint's mask: top_logprobs only among the tokens it allowed."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]
    token_ids: list[int] | None = None
    top_token_ids: list[list[int] | None] | None = Field(
        None, description="Extension (return_token_ids): the ids of each token's top_logprobs, in order.")
    forced: list[bool] | None = Field(
        None, description="Extension (return_token_ids with a constraint): per token, whether the "
        "constraint allowed that token only (so the model did not choose it).")


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """The whole answer, or (streaming) one chunk: the same shape, one choice's new piece per chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    """A new token's text (``bytes:\\xNN...`` when it is not UTF-8 on its own), log-probability, its
    bytes, and the N most likely alternatives."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One event of a chat stream: a choice's role (first), then its new text, then its finish reason;
    with include_usage, a last chunk with no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inferno"
    max_model_len: int
    #: The model family inferno runs it as ("gpt2", "llama") and its config.json model_type ("qwen3", ...).
    family: str
    architecture: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "loading", "shutting_down", "failed"]
    model: str
    slots_total: int | None = None
    slots_free: int | None = None
    requests_running: int | None = None
    requests_waiting: int | None = None
    error: str | None = None


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    content: str
    prompt: str


class TokenizerInfo(BaseModel):
    model: str
    tokenizer: str
    eos_token: str
    eos_token_id: int
    vocab_size: int
    max_model_len: int
    special_tokens: dict[str, int]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape."""

    error: ErrorInfo
