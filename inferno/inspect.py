"""Looking inside the model: every layer's attention weights and the logit lens, for one text.

`inspect_ids(model, ids)` runs the blocks one at a time (`CausalLM.block`) on a temporary KV cache of
exactly T positions, through the model's checked kernels, and keeps

- **attention**: each block's softmax weights, queries × keys, causal (0 above the diagonal, rows
  summing to 1), from the backend's optional `self_attention_weights` (by default its own projections
  and attention, the weights computed on the host from its q and keys: `Backend.attention_weights`);
- **the logit lens**: each residual stream (layer 0 is the embedding, layer i + 1 the stream after block
  i) through the final layer norm and the tied LM head, as the `top` most likely tokens with their
  probabilities at each position. The last layer's is the model's own next-token distribution.

Layers whose attention is not asked for run the backend's ordinary `self_attention`. Generation, scoring
and the engine never come here: nothing of this costs anything unless it is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from inferno.backends.base import Array
from inferno.models.causal_lm import CausalLM
from inferno.options import logsumexp, top_logprobs

#: Positions sent through the LM head at a time for the logit lens: [128, 50257] float32 logits are 26 MB,
#: so a 1024-token text at a large shape never holds a whole layer's logits on the host.
LENS_POSITIONS = 128


class InspectionCancelled(Exception):
    """`inspect_ids` stopped because its `cancelled()` said so (the caller no longer wants the result)."""


class InspectionError(ValueError):
    """A bad inspection request (an empty text, a layer or head out of range, a bad `top`); `param` is
    the argument at fault ("ids", "layers", "heads", "positions", "top")."""

    def __init__(self, message: str, param: str = "ids") -> None:
        super().__init__(message)
        self.param = param


@dataclass
class Inspection:
    """What `inspect_ids` (and `Pipeline.inspect`) found for one text.

    ``attention[a, b]`` is block ``layers[a]``'s head ``heads[b]``: [T, T] float32 weights, row = query
    position, column = key position. ``logit_lens[l][j]`` is the lens of layer l (0 = the embedding,
    l = block l - 1's output, ``n_layer`` = the model's output) at position ``positions[j]``: the `top`
    (token id, probability) pairs, most likely first. ``tokens`` are the ids' texts (filled in by
    `Pipeline.inspect`, which has the tokenizer).
    """

    ids: list[int]
    layers: list[int]
    heads: list[int]
    attention: np.ndarray
    positions: list[int]
    logit_lens: list[list[list[tuple[int, float]]]]
    tokens: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        """Layers of the logit lens (n_layer + 1: the embedding and every block)."""
        return len(self.logit_lens)


def subset(name: str, values: Sequence[int] | int | None, count: int, what: str) -> list[int]:
    """`values` (None: all of 0 .. count - 1; one int; or a list of distinct ints) checked against
    ``[0, count)``, sorted. Raises `InspectionError` naming `name`: at once for a list longer than
    `count` (it must repeat one), else at the first value out of range or seen before (one pass)."""
    if values is None:
        return list(range(count))
    if isinstance(values, Integral) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise InspectionError(f"{name} must be a non-empty list of {what} in [0, {count}), "
                              f"got {values!r:.60}", name)
    if len(values) > count:
        raise InspectionError(f"{name} lists {len(values)} {what}, more than the {count} there are (each "
                              "at most once)", name)
    seen: set[int] = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, Integral) or not 0 <= v < count:
            raise InspectionError(f"{name}: {v!r:.40} is not one of the model's {what} (integers in "
                                  f"[0, {count}))", name)
        if int(v) in seen:
            raise InspectionError(f"{name} lists {what} {int(v)} twice", name)
        seen.add(int(v))
    return sorted(seen)


def inspect_ids(model: CausalLM, ids: Sequence[int], *, layers: Sequence[int] | int | None = None,
                heads: Sequence[int] | int | None = None, positions: Sequence[int] | int | None = None,
                top: int = 5, sample_limit: int | None = None,
                cancelled: Callable[[], bool] | None = None) -> Inspection:
    """Attention weights of `layers` × `heads` (default: all) and the logit lens at `positions`
    (default: all) for `ids`, `top` tokens a position. `sample_limit` restricts the lens's
    distribution to the ids below it (a vocabulary padded past the tokenizer's), as scoring does.
    `cancelled()` is asked before each block; when it says True, `InspectionCancelled` is raised (a
    server's client has left: the rest of the work would be for nobody)."""
    c = model.config
    ids = [int(i) for i in ids]
    if not ids:
        raise InspectionError("there are no tokens to inspect")
    if len(ids) > c.n_positions:
        raise InspectionError(f"the text is {len(ids)} tokens long but the model's context holds "
                              f"{c.n_positions}")
    limit = c.vocab_size if sample_limit is None else min(sample_limit, c.vocab_size)
    bad = [i for i in ids if not 0 <= i < c.vocab_size]
    if bad:
        raise InspectionError(f"token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})")
    layers = subset("layers", layers, c.n_layer, "layers")
    heads = subset("heads", heads, c.n_head, "heads")
    t = len(ids)
    positions = subset("positions", positions, t, "positions")
    if isinstance(top, bool) or not isinstance(top, Integral) or not 1 <= top <= limit:
        raise InspectionError(f"top must be an integer in [1, {limit}], got {top!r}", "top")

    be = model.kernels.kernels("inspect")
    cache = model.new_cache(1, t)
    attention = np.zeros((len(layers), len(heads), t, t), dtype=np.float32)
    row = {layer: a for a, layer in enumerate(layers)}

    def attend(i: int, blk, h: Array) -> Array:
        if i not in row:
            return model.attention_layer(be, i, h, cache, 0)
        out, weights = model.attention_layer(be, i, h, cache, 0, weights=True)
        attention[row[i]] = weights[0, heads]
        return out

    x = model.embed(be, np.asarray([ids], dtype=np.int64))
    lens = [_lens(model, be, x, positions, top, limit)]
    for i in range(c.n_layer):
        if cancelled is not None and cancelled():
            raise InspectionCancelled(f"cancelled before block {i}")
        x = model.block(be, i, x, attend)
        lens.append(_lens(model, be, x, positions, top, limit))
    cache.length = t
    return Inspection(ids, layers, heads, attention, positions, lens)


def _lens(model: CausalLM, be, x: Array, positions: list[int], top: int,
          limit: int) -> list[list[tuple[int, float]]]:
    """The logit lens of one residual stream x [1, T, C] at `positions`: ln_f, the LM head, the softmax
    (in float64 over the ids below `limit`), the `top` (id, probability) pairs of each position."""
    out = []
    for start in range(0, len(positions), LENS_POSITIONS):
        chunk = positions[start : start + LENS_POSITIONS]
        logits = model.logits(be, _gather(be, x, chunk))
        host = model.check_logits(model.backend.to_numpy(logits)[0], len(chunk))[:, :limit]
        for r in host:
            out.append([(i, math.exp(lp)) for i, lp in top_logprobs(r, top, float(logsumexp(r)))])
    return out


def _gather(be, x: Array, positions: list[int]) -> Array:
    """x[:, positions, :] with the kernels the model already uses (a run of consecutive positions is one
    slice; every axis indexed, as the Array API requires)."""
    if positions == list(range(positions[0], positions[-1] + 1)):
        return x[:, positions[0] : positions[-1] + 1, :]
    parts = [x[:, p : p + 1, :] for p in positions]
    return parts[0] if len(parts) == 1 else be.concat(parts, axis=1)
