"""Structured output from the command line (#42): `inferno --json-schema/--json-object/--regex/--choice/
--grammar` on random weights sampled at temperature 1 (unconstrained, gibberish), whose output must
conform every time: parsed and validated with jsonschema, matched with re.fullmatch, found among the
choices, parsed by the grammar's own language. And what is refused, each in one line with exit code 2
naming the flag: two constraints at once, a missing or unreadable file, JSON that does not parse, a
schema, pattern or grammar that llguidance refuses, llguidance missing."""

from __future__ import annotations

import json
import re
import sys

import pytest
from cli_helpers import assert_one_line_error, offline_env, run_inferno

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "size": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                         "ok": {"type": "boolean"}},
          "required": ["name", "size", "ok"], "additionalProperties": False}
REGEX = r"[A-Z][a-z]{1,5}-[0-9]{2,3}"
CHOICES = ["yes", "no", "maybe not"]
# Sums of single digits: "3+4+1".
GRAMMAR = 'start: expr\nexpr: DIGIT ("+" DIGIT)*\nDIGIT: /[0-9]/\n'
SUM = re.compile(r"[0-9](\+[0-9])*")


@pytest.fixture
def env(tmp_path):
    return offline_env(tmp_path)


@pytest.fixture
def loaded(monkeypatch, pipe):
    """The command line on the session's Pipeline of that model (loaded once; its tokenizer's compiled
    constraints cached): loading is not what these tests check, and each load would build llguidance's
    view of a new tokenizer again."""
    monkeypatch.setattr("inferno.cli.generate.load", lambda args: pipe)
    return pipe


def _run(model_dir, env, *flags: str, seed: int = 0, n: int = 40, cwd=None) -> dict:
    proc = run_inferno(["-m", str(model_dir), "Hello", "-n", str(n), "-t", "1", "-s", str(seed), "-j",
                        *flags], env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _check(kind: str, result: dict) -> None:
    """The output of a run constrained by `kind` conforms (a cut one, as far as it got)."""
    text, done = result["text"], result["finish_reason"] == "stop"
    if kind == "json-schema":
        assert done, result
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "json-object":  # any object: on random weights it may run past the budget
        assert isinstance(json.loads(text), dict) if done else text.lstrip().startswith("{"), result
    elif kind == "regex":
        assert done and re.fullmatch(REGEX, text), result
    elif kind == "choice":
        assert done and text in CHOICES, result
    else:
        assert SUM.fullmatch(text if done else text.rstrip("+")), result


FLAGS = {"json-schema": ["--json-schema", json.dumps(SCHEMA)], "json-object": ["--json-object"],
         "regex": ["--regex", REGEX], "choice": [x for c in CHOICES for x in ("--choice", c)],
         "grammar": ["--grammar", "sum.lark"]}
#: Tokens each may take: the schema's, the pattern's, the choices' outputs are far shorter; any JSON
#: object (numbers of any length) and sums may go on, and are checked as far as they got.
BUDGET = {"json-schema": 40, "json-object": 16, "regex": 40, "choice": 40, "grammar": 12}


@pytest.mark.parametrize("kind", FLAGS)
def test_each_flag_constrains_the_output(model_dir, env, loaded, tmp_path, kind):
    (tmp_path / "sum.lark").write_text(GRAMMAR)
    _check(kind, _run(model_dir, env, *FLAGS[kind], n=BUDGET[kind], cwd=tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", FLAGS)
def test_each_flag_constrains_the_output_whatever_the_seed(model_dir, env, loaded, tmp_path, kind):
    (tmp_path / "sum.lark").write_text(GRAMMAR)
    for seed in range(1, 9):
        _check(kind, _run(model_dir, env, *FLAGS[kind], seed=seed, n=BUDGET[kind], cwd=tmp_path))


def test_a_schema_file_is_the_same_constraint_as_its_inline_json(model_dir, env, loaded, tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA, indent=2))
    inline = _run(model_dir, env, "--json-schema", json.dumps(SCHEMA), seed=5)
    from_file = _run(model_dir, env, "--json-schema", "schema.json", seed=5, cwd=tmp_path)
    _check("json-schema", inline)
    assert from_file["text"] == inline["text"]  # the same constraint, the same seed: the same text


def test_unconstrained_output_does_not_conform(model_dir, env, loaded):
    # The weights are random: without a flag the same run is not JSON (else the tests above prove nothing).
    plain = _run(model_dir, env, n=12)
    with pytest.raises(ValueError):
        json.loads(plain["text"])
    assert not re.fullmatch(REGEX, plain["text"]) and plain["text"] not in CHOICES


def test_max_new_tokens_cuts_the_structure_with_finish_reason_length(model_dir, env, loaded):
    cut = _run(model_dir, env, "--json-schema", json.dumps(SCHEMA), n=3)
    assert cut["finish_reason"] == "length" and len(cut["ids"]) == 3
    assert cut["text"].startswith("{")


def test_streamed_text_conforms_too(model_dir, env, loaded):
    proc = run_inferno(["-m", str(model_dir), "Hello", "-t", "1", "-s", "1", "--regex", REGEX], env)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(REGEX, proc.stdout.removesuffix("\n")), proc.stdout


@pytest.mark.parametrize(("flags", "needles"), [
    (["--regex", "a", "--choice", "b"], ["--choice", "not allowed with", "--regex"]),
    (["--json-object", "--json-schema", "{}"], ["--json-schema", "not allowed with", "--json-object"]),
    (["--json-schema", "missing.json"], ["--json-schema missing.json: No such file or directory"]),
    (["--json-schema", "{not json"], ["--json-schema: not valid JSON: Expecting property name"]),
    (["--json-schema", "notes.txt"],
     ["--json-schema notes.txt: not valid JSON", "inline JSON starts with '{'"]),
    (["--json-schema", '{"type": "bogus"}'], ["inferno: error: --json-schema", "bogus"]),
    (["--regex", "(unclosed"], ["inferno: error: --regex", "unclosed"]),
    (["--grammar", "bad.lark"], ["inferno: error: --grammar"]),
    (["--grammar", "-"], ["--grammar: give a file"]),
    (["--grammar", "."], ["--grammar .: is a folder"]),
    (["--choice", ""], ["inferno: error: --choice"]),
])
def test_bad_constraints_are_one_line_naming_the_flag(model_dir, env, tmp_path, flags, needles):
    (tmp_path / "notes.txt").write_text("not a schema")
    (tmp_path / "bad.lark").write_text("start: ???\n")
    proc = run_inferno(["-m", str(model_dir), "Hello", *flags], env, cwd=tmp_path)
    assert_one_line_error(proc, *needles)


def test_without_llguidance_it_says_what_to_install(model_dir, env, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
    from inferno import structured

    if hasattr(structured, "clear_cache"):
        structured.clear_cache()
    proc = run_inferno(["-m", str(model_dir), "Hello", "--regex", "[0-9]+"], env)
    assert_one_line_error(proc, "--regex", "pip install 'inferno-gpt2[structured]'")
