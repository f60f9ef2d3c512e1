"""The tokenizer over HTTP: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info`` (the shapes
of vLLM's and llama.cpp's servers)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from inferno.serve.errors import ApiError
from inferno.serve.routes.common import ERRORS, new_router
from inferno.serve.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)
from inferno.serve.state import State

router = new_router()


async def tokenize(body: TokenizeRequest, state: State) -> dict:
    """Text (``content``, or ``prompt``) to token ids; <|endoftext|> is id 50256 unless parse_special
    is false."""
    pipe = state.require(draining_ok=True)
    text = body.content if body.content is not None else body.prompt
    if text is None:
        raise ApiError(400, "send the text to tokenize as content (or prompt)", param="content")
    ids = await run_in_threadpool(pipe.tokenizer.encode, text, body.parse_special is not False)
    return {"tokens": ids, "count": len(ids), "max_model_len": pipe.config.n_positions}

router.add_api_route("/tokenize", tokenize, methods=["POST"], response_model=TokenizeResponse,
                     responses=ERRORS)


async def detokenize(body: DetokenizeRequest, state: State) -> dict:
    """Token ids to text (``content``, and the same as ``prompt``)."""
    pipe = state.require(draining_ok=True)
    limit = pipe.tokenizer.vocab_size
    bad = next((i for i in body.tokens if i >= limit), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {limit})", param="tokens")
    try:
        text = pipe.tokenizer.decode(body.tokens)
    except ValueError as exc:  # an id no token uses
        raise ApiError(400, str(exc), param="tokens") from None
    return {"content": text, "prompt": text}

router.add_api_route("/detokenize", detokenize, methods=["POST"], response_model=DetokenizeResponse,
                     responses=ERRORS)


async def tokenizer_info(state: State) -> dict:
    pipe = state.require(draining_ok=True)
    tok, eos = pipe.tokenizer, pipe.config.eos_token_id
    special = tok.special_tokens
    names = {i: t for t, i in special.items()}
    return {"model": state.config.model_id, "tokenizer": "GPT-2 byte-level BPE",
            "eos_token": names.get(eos, ""), "eos_token_id": eos, "vocab_size": tok.vocab_size,
            "max_model_len": pipe.config.n_positions, "special_tokens": special}

router.add_api_route("/tokenizer_info", tokenizer_info, methods=["GET"], response_model=TokenizerInfo,
                     responses={503: ERRORS[503]})
