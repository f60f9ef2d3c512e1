"""The conformance checks: every kernel, the compositions, the KV cache and a whole model.

Each `Check` runs one case of one kernel on a backend and raises `ConformanceError` (an
AssertionError) whose message starts with the kernel and the case, e.g.::

    layernorm [small-variance: x [2, 3, 768] ~ N(0, 0.003²), eps 1e-5 (eps ~ variance)]: output
    differs from the float64 reference in 4608 of 4608 elements; worst at (1, 0, 395): got -4.62025,
    expected -3.19036 (error 1.43; float32: rtol=0.0001, atol=1e-05×max|expected|, max|expected| = 3.19)

A backend whose kernel raises fails the same way (``lm_head [2d-input: ...]: raised TypeError: ...``).

Inputs are random (seeded by the check's id, so runs are reproducible), rounded to float32 on the host
and then to whatever the backend holds; the float64 reference (`inferno.conformance.reference`)
starts from exactly the values the backend holds, so only the kernel's own arithmetic is measured.

**Tolerances** depend on the backend's compute dtype (`Backend.dtype`). An element passes when

    |got - expected| <= rtol * |expected| + atol * max|expected|

i.e. `atol` is relative to the largest magnitude in the expected output, so it scales with the case.

    dtype      rtol    atol     why
    float64    1e-6    1e-6     results cross `to_numpy` as float32 (rounding ~6e-8)
    float32    1e-4    1e-5     a few float32 roundings, sums of up to 3072 terms
    float16    1e-2    1e-2     11-bit significand
    bfloat16   5e-2    5e-2     8-bit significand (unknown dtypes get these too)
    q4         0.15    0.15     4-bit weights, each within its block's scale (1/8 of the block's largest
                                magnitude); the reference keeps the unrounded weights (measured: the
                                suite needs 0.1 with `half:dtype=q4`, fails 4 checks at 0.08)

Checks that chain kernels allow a multiple of that (`factor`): ×2 for mlp, ×4 for self_attention,
ragged_self_attention and cached decode, ×10 for the whole model. So does ``layernorm-large-mean`` (×10):
with a mean of 1e4 even a correct two-pass layer norm loses about eps·mean/std to the rounded mean (a
one-pass E[x²] - E[x]² loses eps·(mean/std)² and still fails by orders of magnitude).

The kinds of checks: "kernel" (each kernel alone, and the from_numpy/to_numpy boundary), "composition"
(mlp, self_attention, ragged_self_attention), "cache" (attention over a cache filled chunk by chunk equals
a full prefill) and "model" (a small random GPT-2 through `inferno.models.gpt2`, against the numpy backend in
float64; ``model-ragged`` runs continuous batching through `Gpt2.forward_ragged` against batch-1 forwards).

The model checks take the paths generation and scoring take, so that a backend (or an Array API
namespace) that passes the suite also generates: ``model-last-position`` (a prefill to the last
position's logits [B, V], then cached decode steps), ``model-last-n`` (scoring's ``forward(last=n)``),
``model-greedy`` (the batch-1 loop of `inferno.generate`) and ``model-engine`` (the batching engine of
`inferno.engine`, stepped by hand: prompt chunks beside decode rows, slot reuse, a prompt shared by two
sequences). The greedy checks compare token ids with the reference's up to the first near-tie: a step
where the reference's logits of the two ids differ by less than twice the model tolerance (either id is
then right, and the sequences may part there).

**Looking inside** (`inferno.inspect`): ``attention_weights`` (host float32 weights [B, H, T, S], equal
to the reference's softmax, exactly 0 past each query's position, garbage past the valid keys unseen)
and ``self_attention_weights`` (its output, cache and weights). Both have defaults in `Backend`; a
backend that overrides them proves the override here.

**The Llama family** (`inferno.conformance.llama_checks`, registered with these): ``embed_tokens``,
``heads``, ``rms_norm``, ``rotary``, ``silu_mul``, ``gqa_attention`` (grouped-query ratios 1, 3, 7 and 8,
odd head sizes, positions past 4096), the ``gated_mlp`` composition, and ``model-llama-*``: small random
Llama, Mistral, Qwen2 and Qwen3 models, batched and ragged, against the numpy backend in float64.

**Ragged batches** (continuous batching): ``embedding`` with a positions array instead of an int offset,
``concat``, and ``ragged_self_attention``, whose reference is each row's own batch-1 causal attention over
its slot's keys 0 .. offset + i only: the checks put large garbage (or a stale earlier sequence) past
every row's valid positions, use slots out of order, and check that each row's keys and values land at
its positions of its slot (read back from the `slot_kv` list, whose entries an immutable backend
replaces) while every other position and every unused slot keeps its contents.
"""

from __future__ import annotations

from collections.abc import Iterable

from inferno.backends.base import Backend

# Importing the check modules registers their checks, in this order (the order `all_checks` keeps).
from inferno.conformance import composition_checks, kernel_checks, llama_checks, model_checks
from inferno.conformance.harness import (  # noqa: F401  (the names the suite's users import from here)
    KINDS,
    TOLERANCES,
    Check,
    ConformanceError,
    Tolerance,
    _Run,
    _shape,
    dtype_name,
    tolerance_for,
)
from inferno.conformance.kernel_checks import _fill_cache  # noqa: F401
from inferno.conformance.model_checks import _near_tie  # noqa: F401

#: Every check, in a fixed order: the GPT-2 kernels, compositions and cache, the models, then the Llama
#: family's kernels and models.
_CHECKS: list[Check] = [*kernel_checks.CHECKS, *composition_checks.CHECKS, *model_checks.CHECKS,
                        *llama_checks.CHECKS]

def all_checks(kinds: Iterable[str] | None = None, kernels: Iterable[str] | None = None) -> list[Check]:
    """The checks, in a fixed order, optionally only some kinds ("kernel", "composition", "cache",
    "model") or kernels ("layernorm", ...)."""
    kinds = set(KINDS if kinds is None else kinds)
    unknown = kinds - set(KINDS)
    if unknown:
        raise ValueError(f"unknown check kinds {sorted(unknown)}; expected some of {KINDS}")
    keep = None if kernels is None else set(kernels)
    return [c for c in _CHECKS if c.kind in kinds and (keep is None or c.kernel in keep)]


def check_backend(backend: Backend, checks: Iterable[Check] | None = None) -> None:
    """Run every check (or `checks`) on `backend`; raise one AssertionError listing all the failures."""
    failures = []
    for check in all_checks() if checks is None else checks:
        try:
            check(backend)
        except ConformanceError as exc:
            failures.append(str(exc))
    if failures:
        head = f"{len(failures)} conformance checks failed for {backend!r}:"
        raise AssertionError("\n".join([head, *failures]))

