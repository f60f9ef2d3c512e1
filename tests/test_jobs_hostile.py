"""Hostile job input: a line far longer than any context is refused before it is tokenized (memory stays
near that of a small job), a line past the per-line limit is refused before it is decoded, and a lone
UTF-16 surrogate in any field is refused as the server refuses it, naming the field."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
from cli_helpers import offline_env

from inferno.jobs import fits, lines
from inferno.jobs.generate import check_request, parse_line, parse_requests
from inferno.jobs.lines import LineError, read_object
from inferno.jobs.score import parse_score_requests

#: Runs the CLI in a process of its own and reports that process's peak resident memory.
_PEAK_RSS = textwrap.dedent("""
    import resource, sys
    from inferno.cli import main
    code = main(sys.argv[1:])
    print("peak_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
    sys.exit(code)
""")


def _peak_rss(tmp_path, model_dir, rows: list[dict], name: str) -> tuple[int, str]:
    source, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, "batch", str(source), "-o", str(out), "-m",
                           str(model_dir), "-n", "2"], capture_output=True, text=True,
                          env=offline_env(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    *said, peak = proc.stderr.strip().splitlines()
    return int(peak.split()[1]) * (1 if sys.platform == "darwin" else 1024), "\n".join(said)  # bytes / KiB


def test_a_prompt_far_past_the_context_is_refused_before_it_is_tokenized(tmp_path, model_dir):
    """A 25 MB prompt used to be tokenized whole (about 0.8 GB here, 1.2 GB in the report) before being
    refused as longer than the context. Now the job's peak memory stays within a few times the line's
    size of a one-line job's."""
    size = 25_000_000
    small, _ = _peak_rss(tmp_path, model_dir, [{"id": "s", "prompt": "Hello"}], "small")
    big, said = _peak_rss(tmp_path, model_dir, [{"id": "s", "prompt": "Hello"},
                                                {"id": "big", "prompt": "ab " * (size // 3)}], "big")
    assert "big.jsonl:2: the prompt is 24999999 characters long, at least" in said, said
    assert "but the model's context holds 128 (refused before tokenizing it)" in said
    assert big - small < 4 * size, (big, small)


def test_the_lower_bound_never_exceeds_the_real_token_count(pipe, monkeypatch):
    """Without its margin, the bound is still a true lower bound, on the texts that pack the most
    characters into a token: the vocabulary's longest tokens, repeated."""
    monkeypatch.setattr(fits, "MARGIN", 1)
    tok = pipe.tokenizer
    longest = sorted(range(len(tok)), key=lambda i: -len(tok.decode([i]).encode()))[:50]
    rng = random.Random(0)
    texts = ["".join(tok.decode([rng.choice(longest)]) for _ in range(40)) for _ in range(20)]
    texts += ["a" * 5000, " " * 3000, "🙂" * 700, "The quick brown fox " * 100]
    for text in texts:
        assert fits.fewest_tokens(tok, text) <= len(tok.encode(text))
    assert fits.longest_token(tok) == max(len(tok.decode([i]).encode()) for i in range(len(tok))) + 1


def test_too_long_only_refuses_what_cannot_fit(pipe):
    tok, context = pipe.tokenizer, pipe.config.n_positions
    assert fits.too_long(tok, "x" * context, context) is None  # no look at the vocabulary needed
    fit = fits.longest_token(tok) * fits.MARGIN * context
    assert fits.too_long(tok, "x" * fit, context) is None  # may fit, as far as the bound knows
    reason = fits.too_long(tok, "x" * (fit + 1), context, "the text")
    assert reason == (f"the text is {fit + 1} characters long, at least {context + 1} tokens, but the "
                      f"model's context holds {context} (refused before tokenizing it)")


def test_the_check_refuses_before_encoding(pipe, monkeypatch):
    monkeypatch.setattr(pipe.tokenizer, "encode", lambda *a, **k: pytest.fail("the prompt was tokenized"))
    req = parse_line(json.dumps({"prompt": "z" * 10_000_000}), 1, 5, True)
    with pytest.raises(LineError, match="refused before tokenizing it"):
        check_request(pipe, req)


def test_a_line_past_the_line_limit_is_refused_before_it_is_decoded(monkeypatch):
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", 100)
    first = json.dumps({"id": "a", "prompt": "x" * 200})
    data = (first + "\n" + json.dumps({"prompt": "ok"}) + "\n").encode()
    requests, errors = parse_requests(data, 5, True)
    assert [r.id for r in requests] == [2]
    assert errors == [(1, f"{len(first)} bytes: more than the 100-byte limit for a line")]


@pytest.mark.parametrize(("row", "field"), [
    ({"prompt": "a\ud800b"}, "prompt"),
    ({"prompt": "ok", "stop": ["fine", "\udfff"]}, "stop[1]"),
    ({"prompt": "ok", "logit_bias": {"\udc80": 1}}, "a key of logit_bias"),
    ({"id": "\ud83d", "prompt": "ok"}, "id"),
    ({"\ud800": 1, "prompt": "ok"}, "a key"),
])
def test_a_lone_surrogate_is_refused_naming_the_field(row, field):
    """json.loads reads "\\ud800" as a lone surrogate, which the tokenizer used to turn into U+FFFD
    without a word; the server refuses such a body, and so does a job's line."""
    data = (json.dumps(row) + "\n").encode()
    for parse in (lambda d: parse_requests(d, 5, True), lambda d: parse_score_requests(d, None)):
        assert parse(data)[1] == [(1, f"{field} holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is "
                                      "not Unicode text; write UTF-8 text (a character beyond U+FFFF may be "
                                      "an escaped pair)")]


def test_an_escaped_surrogate_pair_is_one_character():
    assert read_object('{"prompt": "\\ud83d\\ude00 and \\u00e9"}') == {"prompt": "😀 and é"}
