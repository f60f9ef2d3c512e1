"""What the layers above the model see of it: the `CausalLM` protocol, whatever the architecture.

Generation, scoring, the engine, the server and the jobs take a `CausalLM`, never a family's own class:
`inferno.models.gpt2.Gpt2` and `inferno.models.llama.Llama` both satisfy it. A new architecture is one
file under `inferno/models/` with a class like these and a line in `inferno.models.families`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from inferno.backends.base import Array, Backend
from inferno.kv import KvCache, KvSlots


class ModelConfig(Protocol):
    """The hyper-parameters every layer above the model may read, under GPT-2's names (which the code
    above was written with): a Llama config answers to them too."""

    vocab_size: int
    #: The context: positions the model (and each KV slot) holds.
    n_positions: int
    #: The residual stream's width (hidden_size).
    n_embd: int
    n_layer: int
    #: Query heads; keys and values have `n_kv_head` (fewer under grouped-query attention).
    n_head: int

    @property
    def n_kv_head(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    #: The id generation stops at by default (the first of `eos_token_ids`), and that an empty prompt is.
    eos_token_id: int

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def to_dict(self) -> dict[str, Any]: ...


class CausalLM(Protocol):
    """A causal language model written against the `Backend` protocol (see gpt2.py, llama.py).

    - `forward(ids, cache)`: logits of the last position (or the last `last`, or all) of a batch, the
      ids appended to `cache`; `forward_ragged(rows, slots)`: one step of continuous batching.
    - `new_cache` / `new_slots`: KV caches of the model's shape (`inferno.kv`).
    - `check_logits`: host logits checked (shape, finite), naming the backend when they are not.
    - `embed`, `block`, `attention_layer`, `logits`: the pieces of a forward pass, for code that looks at
      every layer (`inferno.inspect`): the embedding, block i on the residual stream, its attention (with
      the attention weights when asked), the final norm and LM head.
    """

    config: ModelConfig
    backend: Backend
    #: The backend behind the kernel checks (`inferno.backends.checked.CheckedBackend`).
    kernels: Any

    def forward(self, ids: np.ndarray, cache: KvCache | None = None, *, all_logits: bool = False,
                last: int | None = None) -> Array: ...

    def forward_ragged(self, rows: Sequence[tuple[Sequence[int], int, int]], slots: KvSlots,
                       logits_for: Sequence[int] | None = None) -> Array: ...  # per row: its last n

    def new_cache(self, batch: int = 1, capacity: int | None = None) -> KvCache: ...

    def new_slots(self, n_slots: int) -> KvSlots: ...

    def check_logits(self, logits: np.ndarray, rows: int = 1) -> np.ndarray: ...

    def named_weights(self) -> Iterator[tuple[str, Array]]: ...

    def block(self, be: Any, i: int, x: Array, attend: Callable[..., Array],
              keep: Callable[[Array], Array | None] = ...) -> Array | None: ...

    def logits(self, be: Any, x: Array) -> Array: ...

    def embed(self, be: Any, ids: np.ndarray) -> Array: ...

    def attention_layer(self, be: Any, i: int, h: Array, cache: KvCache, offset: int,
                        weights: bool = False) -> Array | tuple[Array, np.ndarray]: ...
