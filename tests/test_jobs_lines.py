"""A JSONL job's lines (inferno/jobs/lines.py), through the parsers `inferno batch` and `inferno score -o`
use: what a line that is not an object is called, how a bad id is described, and that a malformed line
still claims the id it had (a later line with that id is a duplicate)."""

from __future__ import annotations

import pytest

from inferno.jobs.generate import parse_requests
from inferno.jobs.lines import LineError, LongLine, parse_rows, read_object, split_lines
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


def test_split_lines_numbers_every_line_and_drops_only_cr_bom_and_blanks():
    data = b'\xef\xbb\xbf{"a": 1}\r\n\r\n \t\n\r{"b": 2} \r\n{"c": 3}\x0c\n'
    assert list(split_lines(data)) == [(1, b'{"a": 1}'), (4, b'\r{"b": 2} '), (5, b'{"c": 3}\x0c')]
    assert list(split_lines(b"x\n")) == [(1, b"x")] and list(split_lines(b"")) == []
    assert list(split_lines(b"aX\r\nX\r")) == [(1, b"aX"), (2, b"X")]  # only CR is stripped
    assert list(split_lines(b"\n\na")) == [(3, b"a")]
    assert list(split_lines(b"\xef\xbb\xbf\n b")) == [(2, b" b")]


def test_a_line_that_is_not_utf8_is_reported_and_the_next_lines_still_read():
    data = b'{"text": "a"}\n{"text": "\xff"}\n{"text": "b"}\n'
    scores, errors = parse_score_requests(data, None)
    assert [s.id for s in scores] == [1, 3]
    assert errors == [(2, "not UTF-8 (byte 0xff at column 11)")]


def test_a_form_feed_after_the_object_is_not_json_whitespace():
    requests, errors = parse_requests(b'{"prompt": "a"}\x0c\n', 4, True)
    assert requests == [] and len(errors) == 1 and errors[0][1].startswith("not valid JSON: Extra data")


def test_split_lines_gives_the_length_of_a_line_past_its_limit_instead_of_the_line():
    data = b"\xef\xbb\xbf" + b"x" * 10 + b"\n" + b"y" * 11 + b"\r\n\n" + b"z" * 30 + b"\nq\n" + b"w" * 11
    got = list(split_lines(data, 10))
    assert got == [(1, b"x" * 10), (2, 12), (4, 30), (5, b"q"), (6, 11)]  # CR counted, the newline not
    assert [type(raw) for _, raw in got] == [bytes, LongLine, LongLine, bytes, LongLine]
    assert list(split_lines(data)) == [(1, b"x" * 10), (2, b"y" * 11), (4, b"z" * 30), (5, b"q"),
                                       (6, b"w" * 11)]
