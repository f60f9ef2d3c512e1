"""Issue #17, item 1: NaN or Inf in the weights is rejected at load (naming the tensor and the count), and
finite weights that overflow float32 (3e38 in c_fc) are caught by the per-step logits check, which says
the weights are the likely cause."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from goldens import golden_model, write_model_dir
from test_faults_common import assert_one_line_error, cli_env, run_cli

import inferno
from inferno.backends.registry import get_backend
from inferno.engine import Engine
from inferno.models.gpt2 import Gpt2, NonFiniteLogitsError
from inferno.models.weights import WeightsError, load_weights
from inferno.testing import random_state_dict, small_config, write_hub_safetensors

CASES = {
    "nan-in-wte": ("wte.weight", (3, 5), np.nan),
    "inf-in-layernorm-bias": ("h.1.ln_2.bias", (7,), np.inf),
    "nan-in-ln_f": ("ln_f.weight", (0,), -np.inf),
}


def broken_folder(directory: Path, name: str, index: tuple, value: float) -> Path:
    config, sd, _ = golden_model("greedy")
    sd = {k: v.copy() for k, v in sd.items()}
    sd[name][index] = value
    return write_model_dir(directory, config, sd)


@pytest.mark.parametrize("case", CASES)
def test_non_finite_weights_are_rejected_at_load(tmp_path, case):
    name, index, value = CASES[case]
    d = broken_folder(tmp_path / "m", name, index, value)
    proc = run_cli(["Hi", "--model-dir", str(d), "--max-new-tokens", "3"], cli_env(tmp_path))
    assert_one_line_error(proc, "model.safetensors", f"tensor '{name}' holds 1 non-finite value (NaN or Inf)")
    assert proc.stdout == ""  # no '!!!!!' text


@pytest.mark.parametrize("backend", ["numpy", "array-api", "cpu-threaded"])
def test_every_backend_gets_only_finite_weights(tmp_path, backend):
    cfg = small_config()
    sd = random_state_dict(cfg)
    sd["h.0.attn.c_attn.weight"][2, :4] = np.nan
    sd["wpe.weight"][1, 1] = np.inf
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    be = get_backend(backend)
    with pytest.raises(WeightsError) as info:
        load_weights(path, cfg, be.weight_order)
    assert info.value.problems == [
        "tensor 'wpe.weight' holds 1 non-finite value (NaN or Inf) of 256",
        "tensor 'h.0.attn.c_attn.weight' holds 4 non-finite values (NaN or Inf) of 768",
    ]
    be.close()


def test_finite_weights_that_overflow_float32_fail_the_step_naming_the_weights(tmp_path):
    config, sd, _ = golden_model("greedy")
    sd = {k: v.copy() for k, v in sd.items()}
    sd["h.0.mlp.c_fc.weight"][:] = 3e38  # finite, so accepted at load; overflows in float32 compute
    d = write_model_dir(tmp_path / "m", config, sd)
    proc = run_cli(["Hi", "--model-dir", str(d), "--max-new-tokens", "3", "--json"], cli_env(tmp_path))
    assert_one_line_error(proc, "backend 'numpy'", "non-finite logits", "the weights are the likely cause",
                          "3e+38", "h.0.mlp.c_fc.weight")
    assert proc.stdout == ""
    pipe = inferno.load(d, "numpy", download=False)
    with pytest.raises(NonFiniteLogitsError) as info:
        pipe.generate("Hi", max_new_tokens=2)
    assert info.value.cause == "weights" and info.value.backend == "numpy"


def test_engine_rows_are_checked_too(tmp_path):
    # forward_ragged's rows as the engine gets them: the check the engine calls on its host copy.
    config, sd, _ = golden_model("greedy")
    sd = {k: v.copy() for k, v in sd.items()}
    sd["h.1.mlp.c_fc.weight"][:] = 3e38
    model = Gpt2.from_weights(config, sd, get_backend("numpy"))
    slots = model.new_slots(2)
    with np.errstate(over="ignore", invalid="ignore"):
        logits = model.backend.to_numpy(model.forward_ragged([([1, 2, 3], 0, 0), ([4], 1, 0)], slots))
    with pytest.raises(NonFiniteLogitsError, match="weights are the likely cause"):
        model.check_logits(logits, 2)
    with pytest.raises(Exception, match=r"shape \(2, 50257\), expected \(3, 50257\)"):
        model.check_logits(logits, 3)
    assert Engine  # the engine's `_run_batch` calls model.check_logits on the rows (see the report)


def test_the_checks_do_not_change_good_results(tmp_path):
    config, sd, meta = golden_model("greedy")
    d = write_model_dir(tmp_path / "m", config, sd)
    pipe = inferno.load(d, "numpy", download=False)
    prompt = meta.get("prompt_ids") or [464, 2068, 7586]
    out = pipe.generate(list(prompt), max_new_tokens=4, stop_at_eos=False)
    assert len(out.ids) == 4
    assert json.dumps(out.to_dict())  # a plain, finite result
