"""The echoed prompt of a completion (``echo``): its text and, with ``logprobs``, each token's.

The prompt's logprobs are the engine's: `running.submit` asks for them (`Engine.submit_many(...,
prompt_logprobs=N)`), the engine computes them while it prefills the prompt in its steps beside the other
requests, and each choice's handle holds them before its first step. So an echo is batched like any
request and cancelled like any other when its client leaves. The first token has none (null in both
lists). The text and each token's offset in it are known before the engine runs (`echo_parts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferno.options import TokenLogprob
from inferno.serve.planning import Plan
from inferno.serve.token_texts import TokenTexts, clamp_logprob, top_entries, top_ids
from inferno.tokenizer import Tokenizer


@dataclass
class EchoPart:
    """The echoed prompt of one prompt: its ids, its text and where each token's text starts in it."""

    ids: list[int]
    text: str
    offsets: list[int]

    def logprobs(self, texts: TokenTexts, scored: Sequence[TokenLogprob | None] | None,
                 return_ids: bool = False) -> dict:
        """The echo's logprobs object from the engine's prompt logprobs (`Handle.prompt_logprobs`); a
        token without them (the first; all of them when the request ended before its prompt was
        prefilled) has null entries."""
        token_lps: list[float | None] = []
        tops: list[dict | None] = []
        top_id_lists: list[list[int] | None] = []
        for k, i in enumerate(self.ids):
            t = scored[k] if scored is not None and k < len(scored) else None
            token_lps.append(None if t is None else clamp_logprob(t.logprob))
            tops.append(None if t is None else top_entries(texts, i, t.logprob, t.top))
            top_id_lists.append(None if t is None else top_ids(i, t.top))
        out = {"tokens": [texts[i] for i in self.ids], "token_logprobs": token_lps, "top_logprobs": tops,
               "text_offset": list(self.offsets)}
        if return_ids:
            out.update(token_ids=list(self.ids), top_token_ids=top_id_lists)
        return out


def echo_part(ids: Sequence[int], tokenizer: Tokenizer) -> EchoPart:
    """One prompt's echo: its text, and each token's offset (the characters before the token that
    completes them)."""
    decoder, offsets, at = tokenizer.incremental_decoder(), [], 0
    for i in ids:
        offsets.append(at)
        at += len(decoder.feed(i))
    return EchoPart(list(ids), tokenizer.decode(ids), offsets)


def echo_parts(plan: Plan, tokenizer: Tokenizer) -> list[EchoPart]:
    """Every prompt's echo (after `encode_prompts`), in a worker thread: decoding is not free."""
    return [echo_part(ids, tokenizer) for ids in plan.ids]
