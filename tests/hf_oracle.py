"""Hugging Face transformers as the oracle: a `GPT2LMHeadModel` in float64 holding given weights.

Only the oracle tests and scripts/make_goldens.py import this (it needs torch + transformers).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from inferno.models.config import Gpt2Config


def hf_model(config: Gpt2Config, sd: dict[str, np.ndarray]) -> GPT2LMHeadModel:
    """HF's GPT-2 in float64 with eager attention, loaded with `sd` (canonical names, tied LM head)."""
    hc = GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.n_positions, n_embd=config.n_embd,
        n_layer=config.n_layer, n_head=config.n_head, layer_norm_epsilon=config.layer_norm_epsilon,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        attn_implementation="eager",
    )
    model = GPT2LMHeadModel(hc).double().eval()
    state = {f"transformer.{k}": torch.from_numpy(v.astype(np.float64)) for k, v in sd.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(k.endswith((".attn.bias", ".attn.masked_bias")) for k in missing), missing
    return model


def hf_logits(model: GPT2LMHeadModel, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), V] of a full forward pass, float64."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def hf_greedy(model: GPT2LMHeadModel, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens by full recompute, and at each step the gap between the top two logits
    relative to the largest |logit| (a near-tie where float32 rounding may pick the other one)."""
    new: list[int] = []
    gaps: list[float] = []
    for _ in range(n):
        last = hf_logits(model, ids + new)[-1]
        top2 = np.sort(last)[-2:]
        gaps.append(float((top2[1] - top2[0]) / np.abs(last).max()))
        new.append(int(np.argmax(last)))
    return new, gaps
