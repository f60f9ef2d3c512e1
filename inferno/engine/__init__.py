"""Continuous batching: many sequences share every forward step.

One decode step reads every weight once whether it advances one sequence or sixteen, so the engine
runs all its sequences through one `Gpt2.forward_ragged` per step:

    submit ─▶ wait queue (bounded) ─▶ a free KV slot ─▶ prompt, a chunk per step ─▶ one token per step
                                                                        ─▶ finish: the slot is free again

The package, one concept a module:

- `scheduler`: the `Engine` (submission, the wait queue, slots, the step loop, chunked prefill,
  cancellation), its errors, statistics and defaults;
- `handle`: the caller's side of one request (`Handle`: its steps, its result, cancelling it);
- `prefix_cache`: which token ids each KV slot holds, indexed by chained block hashes (`PrefixIndex`);
- `sequence`: the engine's record of one request, and a speculating sequence's drafts and their
  verification within a step.

Every name is importable from `inferno.engine`.
"""

from inferno.engine.handle import Handle, RunningSequence
from inferno.engine.prefix_cache import PrefixIndex, block_hashes
from inferno.engine.scheduler import (
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFIX_BLOCK,
    DEFAULT_QUEUE,
    DEFAULT_SLOTS,
    Engine,
    EngineClosedError,
    EngineError,
    EngineStats,
    QueueFullError,
)

__all__ = [
    "DEFAULT_PREFILL_CHUNK", "DEFAULT_PREFIX_BLOCK", "DEFAULT_QUEUE", "DEFAULT_SLOTS", "Engine",
    "EngineClosedError", "EngineError", "EngineStats", "Handle", "PrefixIndex", "QueueFullError",
    "RunningSequence", "block_hashes",
]
