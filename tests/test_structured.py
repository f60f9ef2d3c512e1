"""Structured output (inferno.structured): constraints are checked when made, every generation path
honours them, and what the mask leaves is what gets sampled and reported.

The models are random (small, GPT-2's vocabulary) and sample at temperature 1, where unconstrained text
is gibberish: whatever conforms, conforms because of the mask. The big sweep is tests/test_structured_sweep.py
(slow).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferno.api import Pipeline
from inferno.backends.registry import get_backend
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions, OptionError, SequenceState, logsumexp
from inferno.structured import INSTALL_HINT, Constraint, ConstraintError
from inferno.testing import random_weights, small_config
from inferno.testing_fixtures import TOKENIZER_JSON
from inferno.tokenizer import Tokenizer

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

EOS = 50256
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
}, "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


@pytest.fixture(scope="module")
def pipe(tokenizer: Tokenizer) -> Pipeline:
    """A one-layer random model with GPT-2's vocabulary: a step costs little more than its LM head."""
    config = small_config(vocab_size=50257, n_positions=128, n_embd=16, n_layer=1, n_head=2)
    model = Gpt2.from_weights(config, random_weights(config, seed=3), get_backend("numpy"))
    return Pipeline(model, tokenizer)


# ----------------------------------------------------------------------------------------- making one
def test_importing_the_module_loads_no_llguidance():
    code = "import sys, inferno.structured, inferno.api; print('llguidance' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("make, field, says", [
    (lambda: Constraint.json_schema({"type": "integr"}), "json_schema", "integr"),
    (lambda: Constraint.json_schema('{"type": ', field="response_format"), "response_format",
     "not valid JSON"),
    (lambda: Constraint.json_schema([1]), "json_schema", "JSON Schema"),
    (lambda: Constraint.json_schema({"type": "string", "format": "nope"}), "json_schema", "nope"),
    (lambda: Constraint.regex("a(b"), "regex", "unclosed group"),
    (lambda: Constraint.regex(""), "regex", "non-empty"),
    (lambda: Constraint.choice("yes"), "choice", "list of strings"),
    (lambda: Constraint.choice([]), "choice", "at least one"),
    (lambda: Constraint.choice(["a", 1]), "choice", "non-empty strings"),
    (lambda: Constraint.grammar("start: missing"), "grammar", "missing"),
    (lambda: Constraint.grammar(" \n", field="structured_outputs.grammar"), "structured_outputs.grammar",
     "non-empty"),
])
def test_a_bad_constraint_names_its_field_and_says_why(make, field, says):
    with pytest.raises(ConstraintError) as info:
        make()
    assert isinstance(info.value, OptionError)
    assert info.value.field == field
    assert says in info.value.reason


def test_without_llguidance_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance raises ImportError
    with pytest.raises(ConstraintError) as info:
        Constraint.regex("a+", field="guided_regex")
    assert (info.value.field, info.value.reason) == ("guided_regex", INSTALL_HINT)


def test_a_constraint_is_plain_hashable_data_that_keeps_the_order_of_properties():
    a = Constraint.json_schema({"type": "object", "properties": {"b": {}, "a": {}}})
    assert a == Constraint.json_schema('{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert a.source.index('"b"') < a.source.index('"a"') and hash(a) == hash(Constraint(a.kind, a.source))
    assert Constraint.choice(["x", "y", "x"]).source == '["x", "y"]'
    assert len({a, Constraint.json_object(), Constraint.regex("a"), Constraint.regex("a")}) == 3


def test_the_api_arguments_and_their_errors(pipe):
    with pytest.raises(ConstraintError) as info:
        pipe.generate("x", regex="a", choice=["a"])
    assert info.value.field == "choice" and "regex" in info.value.reason
    with pytest.raises(ConstraintError) as info:
        pipe.generate("x", response_format={"type": "json_schema", "json_schema": {"schema": {"type": "x"}}})
    assert info.value.field == "response_format.json_schema.schema"
    with pytest.raises(ConstraintError) as info:
        pipe.generate("x", response_format={"type": "json_schema", "json_schema": {"name": "n"}})
    assert info.value.field == "response_format.json_schema"
    with pytest.raises(OptionError) as info:
        pipe.generate("x", options=GenerationOptions(), regex="a")
    assert info.value.field == "regex"
    with pytest.raises(OptionError) as info:
        GenerationOptions(constraint={"type": "object"})
    assert info.value.field == "constraint"
    with pytest.raises(ValueError, match="speculative decoding cannot be combined with a constraint"):
        pipe.generate("x", regex="a+", speculative="ngram")
    # A constraint needs the tokenizer's vocabulary: a sequence without a decoder cannot have one.
    with pytest.raises(OptionError, match="needs a tokenizer"):
        SequenceState(GenerationOptions(constraint=Constraint.regex("a")), [1])
    assert pipe.generate("x", max_new_tokens=3, response_format={"type": "text"}, temperature=1.0,
                         seed=0).ids == pipe.generate("x", max_new_tokens=3, temperature=1.0, seed=0).ids


# ------------------------------------------------------------------------------------ what comes out
CASES = [
    ("json_schema", PERSON, lambda text: jsonschema.validate(json.loads(text), PERSON)),
    ("response_format",
     {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}},
     lambda text: jsonschema.validate(json.loads(text), PERSON)),
    ("regex", r"(\+|-)?[0-9]{1,3}\.[0-9]{2} [A-Z][a-z]{0,5}", None),
    ("choice", ["red", "green", "dark blue", "bleu"], None),
    ("grammar", 'start: expr\nexpr: NUM | "(" expr OP expr ")"\nOP: "+" | "*"\nNUM: /[0-9]{1,3}/', None),
]


def _conforms(kind, spec, check, text):
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choice":
        return text in spec
    if kind == "grammar":  # a tiny recursive-descent check of the grammar above
        def expr(i):
            digits = re.match("[0-9]{1,3}", text[i:])
            if digits:
                return i + digits.end()
            assert text[i] == "("
            i = expr(i + 1)
            assert text[i] in "+*"
            i = expr(i + 1)
            assert text[i] == ")"
            return i + 1
        try:
            return expr(0) == len(text)
        except (AssertionError, IndexError):
            return False
    check(text)
    return True


@pytest.mark.parametrize("kind, spec, check", CASES, ids=[c[0] for c in CASES])
def test_sampled_output_conforms_and_ends_with_stop(pipe, kind, spec, check):
    for seed in range(4):
        r = pipe.generate("Hello", max_new_tokens=60, temperature=1.0, seed=seed, **{kind: spec})
        assert r.finish_reason == "stop", (seed, r.text)
        assert _conforms(kind, spec, check, r.text), (seed, r.text)
    free = pipe.generate("Hello", max_new_tokens=20, temperature=1.0, seed=0)
    with pytest.raises((ValueError, AssertionError)):  # JSONDecodeError is a ValueError
        assert _conforms(kind, spec, lambda t: jsonschema.validate(json.loads(t), PERSON), free.text)


def test_a_pydantic_model_class_is_a_schema(pipe):
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int = pydantic.Field(ge=-9, le=9)
        ok: bool

    r = pipe.generate("p", max_new_tokens=30, temperature=1.0, seed=5, json_schema=Point)
    assert r.finish_reason == "stop" and Point.model_validate_json(r.text).model_dump().keys() == {"x", "ok"}
    assert r.text.startswith('{"x": ')  # the declared order, json.dumps's separators


def test_the_engine_gives_what_batch_one_gives_for_the_same_seed(pipe):
    asks = [{"json_schema": PERSON}, {"regex": r"[a-z]{3,9}!"}, {"choice": ["a b", "c"]},
            {"grammar": CASES[4][1]}, {"json_schema": PERSON, "seed": 9}]
    asks = [{"seed": 1, **a} for a in asks]
    one = [pipe.generate("Hi", max_new_tokens=40, temperature=1.0, logprobs=2, **a) for a in asks]
    batch = pipe.generate_batch(["Hi"] * len(asks), max_new_tokens=40, temperature=1.0, logprobs=2,
                                per_prompt=asks, slots=3)
    for a, b in zip(one, batch, strict=True):
        assert (b.ids, b.text, b.finish_reason) == (a.ids, a.text, a.finish_reason)
        assert [lp.logprob for lp in b.logprobs] == pytest.approx([lp.logprob for lp in a.logprobs], abs=1e-5)
    assert one[0].ids != one[4].ids  # n > 1: each sequence has its own matcher and draws


def test_max_tokens_before_the_end_is_length_with_the_text_so_far(pipe):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 20}
    r = pipe.generate("x", max_new_tokens=5, temperature=1.0, seed=0, json_schema=schema)
    assert r.finish_reason == "length" and len(r.ids) == 5 and r.text.startswith("[")
    with pytest.raises(ValueError):
        json.loads(r.text)


def test_stop_strings_still_apply(pipe):
    r = pipe.generate("x", max_new_tokens=40, temperature=1.0, seed=2, regex="[a-z]{30}", stop=["e"])
    assert r.finish_reason == "stop" and r.stop_reason == "e"
    assert "e" not in r.text and re.fullmatch("[a-z]*", r.text)


def test_eos_ends_an_open_ended_constraint_only_where_it_may_end(pipe):
    # "a+b?" may end after any a: EOS is allowed from then on, never before the first a.
    ends = set()
    for seed in range(6):
        r = pipe.generate("x", max_new_tokens=12, temperature=1.0, seed=seed, regex="(ab)+c?",
                          logit_bias={EOS: 8.0})
        assert re.fullmatch("(ab)+c?", r.text), r.text
        ends.add((r.finish_reason, r.stop_reason))
    assert ("stop", EOS) in ends
    # Without EOS among the stop ids, the EOS the constraint allows still ends it, and is not text.
    r = pipe.generate("x", max_new_tokens=12, temperature=1.0, seed=0, regex="(ab)+c?", stop_at_eos=False,
                      logit_bias={EOS: 30.0})
    assert (r.finish_reason, r.stop_reason) == ("stop", EOS) and re.fullmatch("(ab)+c?", r.text), r.text


def test_logprobs_are_those_of_the_masked_distribution(pipe, tokenizer):
    c = Constraint.regex("[0-9]{2}[a-z]+")
    r = pipe.generate("x", max_new_tokens=6, temperature=1.0, seed=4, logprobs=5, constraint=c)
    state = SequenceState(GenerationOptions(constraint=c), [0], tokenizer.incremental_decoder())
    ids = pipe.encode("x")
    for token, lp in zip(r.ids, r.logprobs, strict=False):
        allowed = state.matcher.allowed()
        row = pipe.logits(ids)[-1].astype(np.float64)
        lse = float(logsumexp(row[allowed]))
        assert lp.logprob == pytest.approx(row[token] - lse, abs=1e-4)
        assert all(allowed[i] for i, _ in lp.top) and len(lp.top) == min(5, allowed.sum())
        assert np.isclose(np.exp(row[allowed] - lse).sum(), 1.0)
        state.matcher.consume(token)
        ids.append(token)


def test_a_forced_token_is_marked_has_logprob_zero_and_takes_no_draw(pipe):
    # After '{"' the schema allows only the one key: several forced tokens in a row.
    steps = list(pipe.tokens("x", max_new_tokens=30, temperature=1.0, seed=0, logprobs=1,
                             json_schema={"type": "object", "properties": {"quantity": {"enum": [1, 22]}},
                                          "required": ["quantity"], "additionalProperties": False}).steps())
    text = "".join(s.text for s in steps)
    assert json.loads(text)["quantity"] in (1, 22)
    forced = [s for s in steps if s.forced]
    assert forced and len(forced) < len(steps)
    assert all(s.logprob.logprob == 0.0 and s.logprob.top == [(s.id, 0.0)] for s in forced)
    assert steps[-1].finish_reason == "stop" and steps[-1].id != EOS  # the closing brace ended it


def test_stream_yields_the_constrained_text(pipe):
    pieces = list(pipe.stream("x", max_new_tokens=40, temperature=1.0, seed=3,
                              choice=["alpha", "beta gamma"]))
    assert "".join(pieces) in ("alpha", "beta gamma")


@pytest.mark.parametrize("params", [{}, {"temperature": 1.0}, {"temperature": 0.7}])
def test_sampling_among_few_allowed_ids_draws_what_the_masked_row_draws(params):
    from inferno.sampling import Sampler, SamplingParams

    rng = np.random.default_rng(0)
    whole, few = Sampler(SamplingParams(seed=1, **params)), Sampler(SamplingParams(seed=1, **params))
    for _ in range(200):
        row = rng.normal(0, 2, 50257).astype(np.float32)
        ids = np.sort(rng.choice(50257, size=int(rng.integers(2, 300)), replace=False))
        masked = np.full_like(row, -np.inf)
        masked[ids] = row[ids]
        assert whole(masked) == ids[few(row[ids])]


# --------------------------------------------------------------------------- the mask, as a property
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from(["person", "regex", "grammar", "choice", "object"]))
def test_the_mask_never_removes_every_token_before_the_structure_can_end(tokenizer, data, which):
    c = {"person": Constraint.json_schema(PERSON), "regex": Constraint.regex(r"(a|bc)*[0-9]{1,2}"),
         "grammar": Constraint.grammar(CASES[4][1]), "choice": Constraint.choice(["yes", "no", "yesno"]),
         "object": Constraint.json_object()}[which]
    m = c.start(tokenizer)
    for _ in range(25):
        if m.finished:
            break
        allowed = m.allowed()
        ordinary = np.flatnonzero(allowed[:EOS])
        # Something may always come next; EOS exactly where the text may end, never where it may not.
        assert ordinary.size or allowed[EOS]
        assert bool(allowed[EOS]) == m.accepting
        if not ordinary.size:
            break
        m.consume(int(ordinary[data.draw(st.integers(0, ordinary.size - 1))]))
    assert m.allowed().any()


def test_a_llama_style_tokenizer_with_several_eos_ids_and_special_tokens():
    """The adapter reads any inferno tokenizer: its byte tokens, its EOS ids (several), its special ids
    (never part of the text). A tiny byte-level BPE with Llama 3's special tokens stands in for the real
    one here (tests/test_structured_sweep.py loads the real Llama 3 and Qwen3 tokenizers)."""
    from inferno.tokenizer.bpe import _BYTE_TO_CHAR

    vocab = {c: i for i, c in enumerate(_BYTE_TO_CHAR.values())}
    vocab.update({"ab": 256, "Ġa": 257})
    special = {"<|begin_of_text|>": 258, "<|end_of_text|>": 259, "<|eot_id|>": 260}
    tok = Tokenizer(vocab, ["a b", "Ġ a"], special, eos_ids=[260, 259], bos_token="<|begin_of_text|>")
    m = Constraint.regex("(ab| a)+").start(tok)
    allowed = m.allowed()
    assert sorted(np.flatnonzero(allowed)) == [vocab["a"], vocab["Ġ"], 256, 257]
    m.consume(256)
    assert m.accepting and allowed.shape == (261,)
    assert list(np.flatnonzero(m.allowed()[258:]) + 258) == [259, 260]  # the EOS ids, not the BOS
