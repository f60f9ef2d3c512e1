"""The tokenizer over HTTP: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``
(`inferno.serve.serving_tokenize`)."""

from __future__ import annotations

from inferno.serve.routes.common import ERRORS, new_router, serving
from inferno.serve.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)
from inferno.serve.serving_tokenize import ServingTokenize

router = new_router()
Tokenize = serving(ServingTokenize)


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
async def tokenize(body: TokenizeRequest, tokenizer: Tokenize) -> dict:
    """Text (``content``, or ``prompt``) to token ids; <|endoftext|> is id 50256 unless parse_special
    is false; with add_special_tokens (or add_special) true, the tokenizer's BOS/EOS around them."""
    return await tokenizer.tokenize(body)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
async def detokenize(body: DetokenizeRequest, tokenizer: Tokenize) -> dict:
    """Token ids to text (``content``, and the same as ``prompt``)."""
    return tokenizer.detokenize(body)


@router.get("/tokenizer_info", response_model=TokenizerInfo, responses={503: ERRORS[503]})
async def tokenizer_info(tokenizer: Tokenize) -> dict:
    return tokenizer.info()
