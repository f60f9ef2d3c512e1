"""Planning a generation request: its fields checked and turned into one `GenerationOptions` per choice,
and its prompts into token ids checked against the vocabulary and the context.

What every generation endpoint shares (``/v1/completions`` and ``/v1/chat/completions``); each
endpoint's serving object reads its own fields into a `Plan` with these pieces.

* ``temperature`` defaults to 1 (OpenAI's default). Choice j of every prompt samples with ``seed + j``.
* A text prompt is encoded with its special tokens (``<|endoftext|>`` is id 50256, as OpenAI's and
  vLLM's servers read it; `Pipeline.generate` reads it as plain text); an empty one is <|endoftext|>.
* A ``max_tokens`` the client sent that does not fit the context after the prompt is refused, as
  OpenAI refuses it (400, ``context_length_exceeded``); a default budget is bounded by the context.
* A constraint on the output (``response_format``, ``structured_outputs``, ``guided_*``; see
  `inferno.serve.constraints`) goes into every choice's options: each choice is constrained on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from inferno.options import GenerationOptions, OptionError
from inferno.serve.constraints import RequestConstraint
from inferno.serve.errors import ApiError
from inferno.serve.schemas import GenerationRequest
from inferno.tokenizer import Tokenizer

DEFAULT_TEMPERATURE = 1.0

# OptionError.field → the request field that carries it (the rest are spelled alike).
_PARAMS = {"stop_ids": "stop_token_ids"}


@dataclass
class Plan:
    """What a request asks for, checked: raw prompts (text or ids), one options per choice of a prompt."""

    prompts: list[str | list[int]]
    options: list[GenerationOptions]
    max_tokens: int
    stop_ids: tuple[int, ...]
    echo: bool
    logprobs: int | None
    stream: bool
    include_usage: bool
    return_ids: bool = False  # the return_token_ids extension
    #: The field that set `max_tokens` when the client sent one (None: a default, bounded by the context).
    max_tokens_field: str | None = None
    ids: list[list[int]] = field(default_factory=list)  # the prompts' ids (`encode_prompts`)
    #: The constraint on the output (structured output), and the field that asked for it; None: none.
    constraint: RequestConstraint | None = None

    @property
    def n(self) -> int:
        return len(self.options)

    @property
    def constrained(self) -> bool:
        """Whether the choices' output is constrained (structured output)."""
        return self.constraint is not None


def _abbreviated(digits: str) -> str:
    return digits if len(digits) <= 40 else f"{digits[:20]}...{digits[-20:]} ({len(digits)} digits)"


def _bias(bias: dict[str, float], sample_limit: int) -> dict[int, float]:
    """logit_bias with int keys; a key too long to be an id is refused before int() (which would
    refuse more than sys.get_int_max_str_digits() digits with a ValueError)."""
    out = {}
    for key, value in bias.items():
        digits = key.lstrip("0") or "0"
        if len(digits) > len(str(sample_limit)):
            raise ApiError(400, f"logit_bias names token id {_abbreviated(digits)}, outside the vocabulary "
                           f"[0, {sample_limit})", param="logit_bias")
        out[int(digits)] = value
    return out


def check_n(req: GenerationRequest, slots: int) -> int:
    n = req.n or 1
    if n > slots:
        raise ApiError(400, f"n={n} needs {n} KV slots at once; this server has {slots} (--slots)", param="n")
    return n


def include_usage(req: GenerationRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)


def choice_options(req: GenerationRequest, *, n: int, logprobs: int | None, sample_limit: int,
                   extra_stop: Sequence[str] = (),
                   constraint: RequestConstraint | None = None) -> list[GenerationOptions]:
    """The options of a prompt's n choices (choice j samples with seed + j), from the fields every
    generation request shares and the request's `constraint` (`request_constraint`); an `ApiError`
    (400) names the field."""
    top_k = req.top_k or 0
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or ())
    base = dict(
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_k=0 if top_k == -1 else top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=(*stop, *extra_stop),
        stop_ids=req.stop_token_ids or (),
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=_bias(req.logit_bias or {}, sample_limit),
        logprobs=logprobs,
        constraint=None if constraint is None else constraint.constraint,  # each choice on its own
    )
    try:
        seeds = [None if req.seed is None else req.seed + j for j in range(n)]
        options = [GenerationOptions(**base, seed=seed) for seed in seeds]
        options[0].check_vocab(sample_limit)
    except OptionError as exc:
        name = exc.field.split("[")[0]
        param = _PARAMS.get(name, name)
        raise ApiError(400, f"{param} {exc.reason}", param=param) from None
    return options


def encode_prompts(plan: Plan, tokenizer: Tokenizer, *, eos_id: int, sample_limit: int, context: int,
                   field: str = "prompt") -> None:
    """Token ids of every prompt (text: <|endoftext|> is the special token; empty: <|endoftext|>),
    checked against the vocabulary and the context, and with the `max_tokens` the client sent; errors
    name `field` (or that of `max_tokens`). The constraint, if any, is compiled for `tokenizer` too.
    Runs in a worker thread: a long text, or a large schema, takes a while."""
    ids_list = []
    for k, prompt in enumerate(plan.prompts):
        where = field if len(plan.prompts) == 1 else f"{field}[{k}]"
        ids = tokenizer.encode(prompt, allow_special=True) if isinstance(prompt, str) else prompt
        ids = ids or [eos_id]
        bad = next((i for i in ids if not 0 <= i < sample_limit), None)
        if bad is not None:
            raise ApiError(400, f"{where}: token id {bad} is outside the vocabulary [0, {sample_limit})",
                           param=field)
        if len(ids) > context:
            raise ApiError(400, f"This model's maximum context length is {context} tokens, but {where} is "
                           f"{len(ids)} tokens long; shorten it", param=field,
                           code="context_length_exceeded")
        asked = plan.max_tokens_field
        if asked is not None and len(ids) + plan.max_tokens > context:
            raise ApiError(400, f"This model's maximum context length is {context} tokens. However, you "
                           f"requested {len(ids) + plan.max_tokens} tokens ({len(ids)} in {where}, "
                           f"{plan.max_tokens} in {asked}). Please reduce the length of {where} or "
                           f"{asked}.", param=asked, code="context_length_exceeded")
        ids_list.append(ids)
    plan.ids = ids_list
    if plan.constraint is not None:
        plan.constraint.compile(tokenizer)
