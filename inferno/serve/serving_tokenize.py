"""The tokenizer over HTTP: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info`` (the shapes
of vLLM's and llama.cpp's servers)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from inferno.serve.errors import ApiError
from inferno.serve.schemas import DetokenizeRequest, TokenizeRequest
from inferno.serve.serving import Serving


class ServingTokenize(Serving):
    """The tokenizer endpoints for one app (they answer while the server drains, as /v1/models does)."""

    async def tokenize(self, body: TokenizeRequest) -> dict:
        """Text (``content``, or ``prompt``) to token ids; <|endoftext|> is id 50256 unless parse_special
        is false; with add_special_tokens (or add_special) true, the tokenizer's BOS/EOS around them."""
        pipe = self.state.require(draining_ok=True)
        text = body.content if body.content is not None else body.prompt
        if text is None:
            raise ApiError(400, "send the text to tokenize as content (or prompt)", param="content")
        given = {v for v in (body.add_special_tokens, body.add_special) if v is not None}
        if len(given) > 1:
            raise ApiError(400, "add_special_tokens and add_special are the same field: send one, or the "
                           "same value in both", param="add_special")
        add = bool(given and given.pop())
        ids = await run_in_threadpool(pipe.tokenizer.encode, text, body.parse_special is not False,
                                      add_special=add)
        return {"tokens": ids, "count": len(ids), "max_model_len": pipe.config.n_positions}

    def detokenize(self, body: DetokenizeRequest) -> dict:
        """Token ids to text (``content``, and the same as ``prompt``)."""
        pipe = self.state.require(draining_ok=True)
        limit = pipe.tokenizer.vocab_size
        bad = next((i for i in body.tokens if i >= limit), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {limit})", param="tokens")
        try:
            text = pipe.tokenizer.decode(body.tokens)
        except ValueError as exc:  # an id no token uses
            raise ApiError(400, str(exc), param="tokens") from None
        return {"content": text, "prompt": text}

    def info(self) -> dict:
        """The tokenizer's vocabulary size, special tokens and the model's context."""
        state = self.state
        pipe = state.require(draining_ok=True)
        tok, eos = pipe.tokenizer, pipe.config.eos_token_id
        special = tok.special_tokens
        names = {i: t for t, i in special.items()}
        return {"model": state.config.model_id, "tokenizer": "GPT-2 byte-level BPE",
                "eos_token": names.get(eos, ""), "eos_token_id": eos, "vocab_size": tok.vocab_size,
                "max_model_len": pipe.config.n_positions, "special_tokens": special}
