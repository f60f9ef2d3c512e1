"""Independent references for what generation should give, written here without inferno's sampling,
generation or option code: expected values for the tests that must not come from the code under test.

* :func:`softmax`, :func:`candidates` - the distribution after temperature, top-k and top-p, from the
  definitions (sort by logit, ties by id; keep the top k; keep the smallest prefix whose mass reaches p).
* :func:`reference_draw` - one seeded draw from such a distribution (inverse CDF over the candidates in
  that order, one ``rng.random()`` per token: the documented way inferno draws).
* :func:`reference_generate` - sampled or greedy continuations by full recompute (`Pipeline.logits`, no
  KV cache, no TokenStream, no Sampler).
* :func:`hf_decode` - Hugging Face ``tokenizers`` decoding ids, as a reference for the text.
"""

from __future__ import annotations

import functools

import numpy as np
from goldens import TOKENIZER_JSON


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def candidates(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0) -> tuple[list[int], np.ndarray]:
    """(ids most likely first, ties by id; their probabilities) after temperature, top-k and top-p."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))
    if top_k:
        order = order[:top_k]
    probs = softmax(z[order])
    if top_p < 1.0:
        total, keep = 0.0, 0
        for keep, p in enumerate(probs, start=1):  # noqa: B007 - keep is the count kept
            total += p
            if total >= top_p:
                break
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return order, probs


def reference_draw(logits: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> int:
    """One draw: u = rng.random(), the first candidate whose cumulative mass exceeds u (of the total).
    Without a cut the candidates are all ids in id order (the order changes which id a given u picks)."""
    if top_k or top_p < 1.0:
        ids, probs = candidates(logits, temperature, top_k, top_p)
    else:
        ids, probs = list(range(len(logits))), softmax(np.asarray(logits, dtype=np.float64) / temperature)
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    i = int(np.searchsorted(cdf, u, side="right"))
    return ids[min(i, len(ids) - 1)]


def penalised(logits: np.ndarray, prompt_ids: list[int], new_ids: list[int], repetition_penalty: float = 1.0,
              presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
              logit_bias: dict[int, float] | None = None) -> np.ndarray:
    """The logits after the penalties and the bias, from their definitions (Hugging Face's repetition
    penalty over prompt and new tokens; OpenAI's presence and frequency penalties over the new ones)."""
    z = np.array(logits, dtype=np.float64)
    for i in set(prompt_ids) | set(new_ids):
        z[i] = z[i] / repetition_penalty if z[i] > 0 else z[i] * repetition_penalty
    for i in set(new_ids):
        z[i] -= frequency_penalty * new_ids.count(i) + presence_penalty
    for i, b in (logit_bias or {}).items():
        z[i] += b
    return z


def reference_generate(pipe, prompt_ids: list[int], n: int, *, temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, seed: int | None = None, **penalties) -> list[int]:
    """n new ids by full recompute at every step (no eos stop), greedy at temperature 0; `penalties`
    are `penalised`'s keywords."""
    rng = np.random.default_rng(seed)
    ids = list(prompt_ids)
    for _ in range(n):
        logits = pipe.logits(ids)[-1]
        if penalties:
            logits = penalised(logits, prompt_ids, ids[len(prompt_ids):], **penalties)
        if temperature == 0:
            ids.append(int(np.argmax(logits)))
        else:
            ids.append(reference_draw(logits, rng, temperature, top_k, top_p))
    return ids[len(prompt_ids):]


@functools.cache
def _hf_tokenizer():
    from tokenizers import Tokenizer as HfTokenizer

    return HfTokenizer.from_file(str(TOKENIZER_JSON))


def hf_decode(ids: list[int]) -> str:
    """The text of `ids` as Hugging Face tokenizers decodes it (special tokens kept)."""
    return _hf_tokenizer().decode(ids, skip_special_tokens=False)


def hf_encode(text: str) -> list[int]:
    return _hf_tokenizer().encode(text, add_special_tokens=False).ids
