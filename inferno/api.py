"""The Python API: `inferno.load()` and the `Pipeline` it returns.

    import inferno
    model = inferno.load()                      # ./gpt2, the HF cache, or a download
    print(model.generate("The quick brown fox", max_new_tokens=20).text)
    for piece in model.stream("Once upon a time", max_new_tokens=50, temperature=0.8, top_k=40, seed=1):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from inferno.backends.base import Backend
from inferno.backends.registry import get_backend
from inferno.config import Gpt2Config
from inferno.generate import GenerationResult, TokenStream, check_ids, generate_tokens
from inferno.hub import resolve_model_dir
from inferno.model import Gpt2
from inferno.sampling import SamplingParams
from inferno.tokenizer import Tokenizer
from inferno.weights import load_weights


class Pipeline:
    """A loaded model with its tokenizer: text in, text out."""

    def __init__(self, model: Gpt2, tokenizer: Tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @property
    def config(self) -> Gpt2Config:
        return self.model.config

    @property
    def backend(self) -> Backend:
        return self.model.backend

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Prompt text or ids → ids; an empty prompt is ``[<|endoftext|>]`` (unconditional generation)."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        return ids or [self.config.eos_token_id]

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Full forward pass without a cache: float32 logits [len(ids), vocab_size]."""
        ids = check_ids(ids, self.config)
        out = self.model.forward(np.asarray([ids]), all_logits=True)
        return self.backend.to_numpy(out)[0]

    def tokens(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 50,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
    ) -> TokenStream:
        """An iterator over new token ids; its `finish_reason` is set when it ends."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        stop = (self.config.eos_token_id,) if stop_at_eos else ()
        # A vocabulary padded past the tokenizer's (as some exports do) must not yield undecodable ids.
        limit = min(self.config.vocab_size, self.tokenizer.vocab_size)
        return generate_tokens(self.model, self.encode(prompt), max_new_tokens, params, stop, limit)

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[str]:
        """Yield text pieces as tokens arrive (same arguments as `generate`).

        A multi-byte character split across tokens is held back until complete. The stop token
        itself is not yielded as text.
        """
        stream = self.tokens(prompt, **kwargs)
        decoder = self.tokenizer.incremental_decoder()
        for token in stream:
            if token in stream.stop_ids:
                continue  # the stream ends right after it
            piece = decoder.feed(token)
            if piece:
                yield piece
        tail = decoder.flush()
        if tail:
            yield tail

    def generate(self, prompt: str | Sequence[int], **kwargs) -> GenerationResult:
        """Generate and return the whole result (new ids, text, finish reason, timing).

        Keyword arguments: max_new_tokens=50, temperature=0.0 (greedy), top_k=0 (off), top_p=1.0
        (off), seed=None, stop_at_eos=True.
        """
        start = time.perf_counter()
        stream = self.tokens(prompt, **kwargs)
        ids = list(stream)
        return stream.result(ids, self.tokenizer.decode, time.perf_counter() - start)


def load(
    model_dir: str | os.PathLike | None = None,
    backend: str | Backend | None = None,
    *,
    download: bool = True,
) -> Pipeline:
    """Load GPT-2 from `model_dir` (else ./gpt2, the Hugging Face cache, or a download).

    `backend` is a registered name (default: $INFERNO_BACKEND, else "numpy"), optionally with
    options as ``"name:key=value,..."``, or a `Backend` instance.
    """
    be = backend if isinstance(backend, Backend) else get_backend(backend)
    directory = resolve_model_dir(model_dir, download=download)
    config = Gpt2Config.from_file(Path(directory) / "config.json")
    tokenizer = Tokenizer.from_file(Path(directory) / "tokenizer.json")
    weights = load_weights(Path(directory) / "model.safetensors", config, be.weight_order)
    model = Gpt2.from_weights(config, weights, be)
    return Pipeline(model, tokenizer)
