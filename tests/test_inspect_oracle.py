"""`inspect` against Hugging Face transformers (float64, eager attention) on the same random weights, on
every backend and weight format.

HF's ``output_attentions`` are the attention weights; its ``output_hidden_states`` are the residual
streams (the embedding, then each block's output, the last one with ``ln_f`` already applied), so the
logit lens of layer l is ``softmax(lm_head(ln_f(hidden_states[l])))`` for l < n_layer and HF's own
next-token distribution for the last. Tolerance: 1e-5 absolute, on the weights and on the
probabilities. A 16-bit or 8-bit backend is compared with HF holding the very weights it holds (rounded
to its format, or quantized and multiplied back), so only the arithmetic is measured.

Run with `python -m pytest -m oracle tests/test_inspect_oracle.py` (needs torch + transformers).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_oracle import hf_model  # noqa: E402

from inferno.backends.registry import get_backend  # noqa: E402
from inferno.inspect import inspect_ids  # noqa: E402
from inferno.models.gpt2 import Gpt2  # noqa: E402
from inferno.testing import random_state_dict, small_config  # noqa: E402

pytestmark = pytest.mark.oracle

TOL = 1e-5
#: int8 also quantizes each product's inputs (blocks of 32, as q8_0), which HF holding the dequantized
#: weights does not: its arithmetic is not HF's, so it is held to what that rounding moves (measured
#: up to 0.057 on these sharp attentions), not to 1e-5; the plugin's own tests check its products
#: against float64 on the quantized inputs at 1e-5.
TOLS = {"half:dtype=int8": 0.1}
# Sharper attention than the default random model's (so the weights are far from uniform): the error of
# float32 arithmetic grows with the scores' spread; at this gain the worst seen is 4e-6, at 3 it was 1.2e-5.
ATTN_GAIN = 2.0
# Odd shapes: head sizes 8 and 5 and 16, a single token, a text that fills the whole context.
SHAPES = {
    "C40-H5-L3-T37": (small_config(vocab_size=300, n_positions=48, n_embd=40, n_layer=3, n_head=5), 37),
    "C24-H3-L2-T1": (small_config(vocab_size=97, n_positions=20, n_embd=24, n_layer=2, n_head=3), 1),
    "C48-H3-L2-T20-full": (small_config(vocab_size=131, n_positions=20, n_embd=48, n_layer=2, n_head=3), 20),
}
BACKENDS = ["numpy", "array-api", "cpu-threaded", "half:dtype=float16", "half:dtype=bfloat16",
            "half:dtype=int8", "torch"]


def _backend(spec: str):
    name = spec.split(":")[0]
    if name == "half":
        pytest.importorskip("inferno_half")
    if name == "torch":
        pytest.importorskip("inferno_torch")
    return get_backend(spec)


def held_weights(sd: dict[str, np.ndarray], spec: str) -> dict[str, np.ndarray]:
    """The values `spec`'s backend holds for `sd`: the half backend's matrices rounded to its format (or
    int8-quantized per output and multiplied back); every other weight, and every other backend, as is."""
    if not spec.startswith("half"):
        return sd
    import inferno_half.backend as hb

    fmt = spec.split("=")[1]
    out = {}
    for name, w in sd.items():
        if name.endswith(hb.MATRICES[:4]):  # [in, out]: one scale per output column
            out_in = w.T
        elif name in hb.MATRICES[4:]:  # [V, C] is [out, in]: one scale per row
            out_in = w
        else:
            out[name] = w
            continue
        if fmt == "int8":
            q, scales = hb.quantize(np.ascontiguousarray(out_in, dtype=np.float32))
            held = q.astype(np.float64) * scales.astype(np.float64)[:, None]
        else:
            held = hb.from_bits(hb.to_bits(out_in, fmt), fmt).astype(np.float64)
        out[name] = held.T if out_in is not w else held
    return out


def hf_inspect(config, sd, ids):
    """HF's attention [L, H, T, T] and the logit-lens probabilities [L + 1, T, V], float64."""
    model = hf_model(config, sd)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
        attention = np.stack([a[0].numpy() for a in out.attentions])
        lens = [model.lm_head(model.transformer.ln_f(h))[0] for h in out.hidden_states[:-1]]
        lens.append(out.logits[0])  # hidden_states[-1] already went through ln_f
        probs = np.stack([torch.softmax(x, dim=-1).numpy() for x in lens])
    return attention, probs


@pytest.mark.parametrize("spec", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_attention_and_logit_lens_equal_transformers(spec, shape):
    config, t = SHAPES[shape]
    sd = random_state_dict(config, seed=31, attn_gain=ATTN_GAIN)
    backend = _backend(spec)
    model = Gpt2.from_weights(config, sd, backend)
    ids = np.random.default_rng(7).integers(0, config.vocab_size, t).tolist()
    top = 5
    got = inspect_ids(model, ids, top=top)
    want_attention, want_probs = hf_inspect(config, held_weights(sd, spec), ids)

    if t > 2:  # the comparison means something: some query attends mostly to one key, not uniformly
        assert want_attention[:, :, 2:].max() > 0.5
    assert got.attention.dtype == np.float32
    assert got.attention.shape == (config.n_layer, config.n_head, t, t)
    tol = TOLS.get(spec, TOL)
    err = np.abs(got.attention.astype(np.float64) - want_attention).max()
    assert err <= tol, f"{spec}: attention differs from transformers by {err:.3g}"

    assert len(got.logit_lens) == config.n_layer + 1
    for layer, rows in enumerate(got.logit_lens):
        assert len(rows) == t
        for pos, pairs in enumerate(rows):
            want = want_probs[layer, pos]
            kth = np.sort(want)[-top]  # the top-th largest probability: every id listed is at least this
            assert len(pairs) == top
            probs = [p for _, p in pairs]
            assert probs == sorted(probs, reverse=True)
            for i, p in pairs:
                at = f"{spec} layer {layer} position {pos} id {i}"
                assert abs(p - want[i]) <= tol, f"{at}: {p} vs transformers' {want[i]}"
                assert want[i] >= kth - tol, f"{at} is not in transformers' top {top}"
    backend.close()
