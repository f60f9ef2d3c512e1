"""Structured output in batch jobs (#42): a line's ``response_format``, ``structured_outputs`` and
``guided_*`` fields, as the server takes them, and a Batch API body's; the output of every such line
conforms (random weights at temperature 1), and a bad field is that line's error naming it, the other
lines running."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import assert_line_reports, offline_env, run_inferno

from inferno.jobs.generate import known_keys, parse_line, parse_requests
from inferno.jobs.lines import LineError

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
REGEX = r"[a-c]{2}[0-9]"
CHOICES = ["red", "green", "blue"]
GRAMMAR = 'start: "(" DIGIT ")"\nDIGIT: /[0-9]/\n'


def _error(obj: dict) -> str:
    with pytest.raises(LineError) as info:
        parse_line(json.dumps({"prompt": "Hi", **obj}), 1, 16, True)
    return str(info.value)


@pytest.mark.parametrize(("fields", "kind"), [
    ({"response_format": {"type": "json_object"}}, "json_object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA,
                                                                 "strict": True}}}, "json_schema"),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema"),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, "json_schema"),
    ({"structured_outputs": {"regex": REGEX}}, "regex"),
    ({"structured_outputs": {"choice": CHOICES}}, "choice"),
    ({"structured_outputs": {"grammar": GRAMMAR}}, "grammar"),
    ({"structured_outputs": {"json_object": True}}, "json_object"),
    ({"guided_json": SCHEMA}, "json_schema"),
    ({"guided_regex": REGEX}, "regex"),
    ({"guided_choice": CHOICES}, "choice"),
    ({"guided_grammar": GRAMMAR}, "grammar"),
])
def test_every_spelling_gives_its_constraint(fields, kind):
    req = parse_line(json.dumps({"prompt": "Hi", **fields}), 1, 16, True)
    assert req.options.constraint is not None and req.options.constraint.kind == kind


def test_plain_text_asks_for_no_constraint_and_the_keys_are_listed():
    for fields in ({}, {"response_format": {"type": "text"}}, {"response_format": None},
                   {"guided_regex": None}):
        assert parse_line(json.dumps({"prompt": "Hi", **fields}), 1, 16, True).options.constraint is None
    keys = known_keys()
    assert "response_format" in keys and "guided_choice" in keys and "constraint" not in keys


@pytest.mark.parametrize(("fields", "message"), [
    ({"guided_regex": "a", "guided_choice": ["b"]},
     "guided_regex and guided_choice both constrain the output"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "response_format and structured_outputs both constrain the output"),
    ({"response_format": "json"}, "response_format must be an object with a type"),
    ({"response_format": {"type": "xml"}}, 'response_format.type must be "text", "json_object" or '
     '"json_schema", got "xml"'),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema must be a JSON Schema object, got null"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strct": True}}},
     "response_format.json_schema.strct is not a field"),
    ({"response_format": {"type": "json_object", "schema": {}}},
     'response_format.schema is not a field of a response_format of type "json_object"'),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}},
     "structured_outputs must give one of json, regex, choice, grammar, json_object, got regex and choice"),
    ({"structured_outputs": {}}, "structured_outputs must give one of"),
    ({"structured_outputs": {"whitespace_pattern": " "}},
     "structured_outputs.whitespace_pattern is not supported"),
    ({"structured_outputs": "a+"}, "structured_outputs must be an object"),
    ({"structured_outputs": {"json_object": "yes"}},
     'structured_outputs.json_object must be true, got "yes"'),
    ({"guided_regex": 5}, "guided_regex must be a string, got 5"),
    ({"guided_choice": "red"}, 'guided_choice must be a non-empty list of strings, got "red"'),
    ({"guided_choice": []}, "guided_choice must be a non-empty list of strings"),
    ({"guided_json": 5}, "guided_json must be a JSON Schema"),
    ({"guided_regex": "(a"}, "guided_regex"),
    ({"guided_json": {"type": "bogus"}}, "guided_json"),
    ({"structured_outputs": {"grammar": "start: ???"}}, "structured_outputs.grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}},
     "response_format.json_schema.schema"),
])
def test_a_bad_field_is_the_line_s_error_naming_it(fields, message):
    said = _error(fields)
    assert said.startswith(message) and "\n" not in said, said


def test_the_library_s_message_is_kept():
    assert "bogus" in _error({"guided_json": {"type": "bogus"}})
    assert "unclosed" in _error({"guided_regex": "[a"}).lower()


def test_without_llguidance_a_line_says_what_to_install(monkeypatch):
    import sys

    from inferno import structured

    monkeypatch.setitem(sys.modules, "llguidance", None)
    structured.clear_cache()
    said = _error({"guided_regex": "[0-9]+"})
    assert said.startswith("guided_regex") and "pip install 'inferno-gpt2[structured]'" in said, said


def _check(kind: str, line: dict) -> None:
    text = line["text"]
    assert line["finish_reason"] == "stop", line
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    else:
        assert re.fullmatch(r"\([0-9]\)", text), text


def test_a_job_s_constrained_lines_conform_and_its_bad_lines_are_reported(model_dir, tmp_path):
    env = offline_env(tmp_path)
    sampled = {"temperature": 1.0, "max_new_tokens": 40}
    rows = [({"id": "j", "prompt": "A", "structured_outputs": {"json": SCHEMA}, **sampled, "seed": 1}, None),
            ({"id": "r", "prompt": "B", "guided_regex": REGEX, **sampled, "seed": 2}, None),
            ({"id": "c", "prompt": "C", "guided_choice": CHOICES, **sampled, "seed": 3}, None),
            ({"id": "g", "prompt": "D", "guided_grammar": GRAMMAR, **sampled, "seed": 4}, None),
            ({"id": "f", "prompt": "E", **sampled, "seed": 5,
              "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}}},
             None),
            ({"id": "bad", "prompt": "F", "guided_regex": "(a"}, ("guided_regex",)),
            ({"id": "two", "prompt": "G", "guided_regex": "a", "guided_choice": ["a"]},
             ("guided_regex and guided_choice both constrain the output",))]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    proc = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert_line_reports(proc, "inferno batch", "in.jsonl", rows)
    got = {line["id"]: line for line in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert set(got) == {"j", "r", "c", "g", "f"}
    for rid, kind in (("j", "json"), ("r", "regex"), ("c", "choice"), ("g", "grammar"), ("f", "json")):
        _check(kind, got[rid])


def test_a_batch_api_body_s_response_format_is_honoured(model_dir, tmp_path):
    env = offline_env(tmp_path)
    body = {"prompt": "A", "max_tokens": 40, "temperature": 1.0, "seed": 7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
    rows = [{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body},
            {"custom_id": "b", "method": "POST", "url": "/v1/completions",
             "body": {**body, "response_format": {"type": "json_schema"}}}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "in.jsonl:2: body: response_format.json_schema must be an object" in proc.stderr
    [line] = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    [choice] = line["response"]["body"]["choices"]
    assert line["custom_id"] == "a" and choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["text"]), SCHEMA)


def test_the_same_fields_parse_the_same_in_a_whole_file():
    data = "".join(json.dumps({"id": i, "prompt": "x", "guided_choice": CHOICES}) + "\n" for i in range(3))
    requests, errors = parse_requests(data.encode(), 8, True)
    assert errors == [] and len({r.options.constraint for r in requests}) == 1  # equal, hashable
