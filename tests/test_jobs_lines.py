"""A JSONL job's lines (inferno/jobs/lines.py), through the parsers `inferno batch` and `inferno score -o`
use: what a line that is not an object is called, how a bad id is described, and that a malformed line
still claims the id it had (a later line with that id is a duplicate)."""

from __future__ import annotations

import pytest

from inferno.jobs.generate import parse_requests
from inferno.jobs.lines import LineError, parse_rows, read_object
from inferno.jobs.score import parse_score_requests


@pytest.mark.parametrize(("text", "kind"), [
    ("[1, 2]", "a list"), ('"hi"', "a string"), ("3", "a number"), ("2.5", "a number"),
    ("true", "true or false"), ("false", "true or false"), ("null", "null"),
])
def test_a_line_that_is_not_an_object_says_what_it_is(text, kind):
    with pytest.raises(LineError) as info:
        read_object(text)
    assert str(info.value) == f"expected a JSON object, got {kind}"
    assert info.value.id is None


@pytest.mark.parametrize(("rid", "shown"), [
    ("[1]", "list"), ('{"a": 1}', "dict"), ("1.5", "1.5"), ("true", "true"), ("null", "null"),
])
def test_a_bad_id_is_shown_as_json_or_by_its_kind(rid, shown):
    requests, errors = parse_requests(f'{{"id": {rid}, "prompt": "x"}}\n'.encode(), 4, True)
    assert requests == [] and errors == [(1, f"id must be a string or an integer, got {shown}")]
    scores, errors = parse_score_requests(f'{{"id": {rid}, "text": "x"}}\n'.encode(), None)
    assert scores == [] and errors == [(1, f"id must be a string or an integer, got {shown}")]


def test_a_malformed_line_claims_its_id():
    data = b'{"id": "a", "text": 5}\n{"id": "a", "text": "fine"}\n'
    scores, errors = parse_score_requests(data, None)
    assert scores == []
    assert errors == [(1, "text must be a string or a list of token ids, got 5"),
                      (2, 'duplicate id "a" (first on line 1)')]


def test_parse_rows_carries_the_id_of_a_line_error():
    def parse(text: str, line: int):
        raise LineError(f"bad {text}", id="same")

    assert parse_rows(b"x\ny\n", parse) == ([], [(1, "bad x"), (2, 'duplicate id "same" (first on line 1)')])
