"""The engine's record of one request while it waits or runs (`EngineSequence`), and the two halves of
a speculating sequence's decode row: its drafts (`draft_row`) and their verification (`verify_row`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferno.engine.handle import Handle
from inferno.models.causal_lm import CausalLM
from inferno.options import TokenLogprob
from inferno.speculative import Speculation, SpeculationStats, adapt, new_speculation, verify_draft


@dataclass
class EngineSequence:
    handle: Handle
    prompt: list[int]
    budget: int  # new tokens it may still take in all (max_new_tokens, bounded by the context)
    slot: int = -1
    cached: int = 0  # tokens of this sequence in its slot
    next_token: int | None = None  # the last chosen token, to feed in the next step
    #: Sequences of the same prompt (`submit_many`): they wait, holding their slots, until this one's
    #: prefill is done, then copy its KV cache and sample their first token from the same logits.
    followers: list[EngineSequence] = field(default_factory=list)
    #: A leader whose own request was cancelled, still prefilling for its followers.
    ghost: bool = False
    #: Prefix caching: a running sequence still prefilling the first `share` tokens of this one's prompt;
    #: this one waits, holding its slot, until they are in that sequence's slot, then copies them.
    source: EngineSequence | None = None
    share: int = 0
    #: Prompt logprobs wanted (the N of the top alternatives; see `Engine.submit_many`), and those of the
    #: prompt's tokens 1 .. so far.
    prompt_logprobs: int | None = None
    scored: list[TokenLogprob] = field(default_factory=list)
    #: Speculative decoding (made at its first decode step, False when it does not speculate), the
    #: drafts of the step running and their distributions.
    speculation: Speculation | None | bool = None
    drafts: list[int] = field(default_factory=list)
    dists: list = field(default_factory=list)

    @property
    def size(self) -> int:
        return 1 + len(self.followers)


def draft_row(seq: EngineSequence, model: CausalLM, speculative: str | None, draft_model: CausalLM | None,
              num_speculative_tokens: int | None, sample_limit: int | None) -> tuple[list[int], list]:
    """The drafts `seq`'s decode row carries this step (none without speculation), as many as its
    budget leaves room for after the token its row's last logits choose."""
    if seq.speculation is None:  # its first decode step
        state = seq.handle.state
        seq.speculation = speculative is not None and state.matcher is None and new_speculation(
            model, state, speculative, draft_model, num_speculative_tokens, sample_limit)
    state, spec = seq.handle.state, seq.speculation
    room = seq.budget - len(state.ids) - 1
    if not spec or room <= 0:
        return [], []
    drafts, dists = spec.drafter.draft([*seq.prompt, *state.ids], min(spec.num_tokens, room))
    return drafts[:room], dists[:room]


def verify_row(seq: EngineSequence, start: int, logits,
               stats: SpeculationStats) -> tuple[int, str | None, BaseException | None]:
    """A speculating sequence's row: its rows of `logits` decide its tokens, while they accept its
    drafts (see `inferno.speculative`); the slot keeps the positions of the tokens verified. Returns
    the tokens handed to the sequence's handle, and its finish reason or error (the engine ends it)."""
    state, spec, drafts = seq.handle.state, seq.speculation, seq.drafts
    accepted, emitted, reason = 0, 0, None
    try:
        for i in range(len(drafts) + 1):
            draft = drafts[i] if i < len(drafts) else None
            token, ok = verify_draft(state, logits[i], draft, seq.dists[i] if draft is not None else None)
            step = state.step(logits[i], last=len(state.ids) + 1 >= seq.budget, token=token)
            emitted += 1
            seq.next_token = step.id
            seq.handle._put(step)
            reason = step.finish_reason
            if not ok or reason is not None:
                break
            accepted += 1
    except Exception as exc:  # a failure of this sequence only
        return emitted, None, exc
    # The sequence goes on after the last token fed and the accepted drafts; the next row overwrites
    # the rest. Till then the prefix index may keep the rejected drafts: the keys and values written
    # for them are those of these tokens after this prefix, whatever the sequence chose.
    seq.cached = start + 1 + accepted
    if drafts:
        stats.count(len(drafts), accepted)
        spec.stats.count(len(drafts), accepted)
        if spec.adaptive:
            spec.num_tokens = adapt(spec.num_tokens, len(drafts), accepted)
    seq.drafts, seq.dists = [], []
    return emitted, reason, None
