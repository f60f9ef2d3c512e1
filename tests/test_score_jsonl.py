"""`inferno score IN.jsonl -o OUT.jsonl` in one process (no Ray), run as a user runs it (a subprocess):
each output line is what `inferno score FILE --json` prints for that text, plus its id; ids given or the
line number; malformed lines reported as IN:LINE and skipped (or, with --strict, exit 2 before OUT is
touched); an existing OUT is resumed and only ever appended to; Parquet and folders need --ray; Ray is
never imported."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from backend_helpers import registered
from cli_helpers import assert_line_reports, assert_one_line_error, offline_env, run_inferno

from inferno.backends.numpy_backend import NumpyBackend
from inferno.cli import main
from inferno.jobs.plan import JobPlan
from inferno.jobs.progress import Progress as _Progress
from inferno.jobs.score import ScoreRequest, parse_score_requests, run_scoring

SCORE = [sys.executable, "-m", "inferno", "score"]
RESULT_KEYS = {"id", "ids", "logprobs", "total_logprob", "perplexity", "stride"}
STATS = re.compile(r"^\[(\d+) texts, (\d+) tokens in \d+\.\d\d s, \d+\.\d tok/s; (\d+) skipped "
                   r"\(already in OUT\), (\d+) malformed\]$")
WORDS = "the quick brown fox jumps over the lazy dog while a cat watches from the warm window".split()


def run_score(args: list[str], env: dict[str, str], *, cwd: Path | None = None,
              input: str | None = None) -> subprocess.CompletedProcess:
    return run_inferno(["score", *args], env, cwd=cwd, input=input)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    # One BLAS thread in every command: the single-text runs must add in the same order as the JSONL run.
    return {**offline_env(tmp_path), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def write_jsonl(path: Path, rows: list) -> Path:
    """Each row: a dict (dumped as JSON), or a str written as it is (blank or malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def output_lines(path: Path) -> list[dict]:
    """The JSON lines of OUT, less the fingerprint of their input line (checked in test_jobs_resume.py),
    so that each compares with what `inferno score --json` prints."""
    out = []
    for raw in path.read_bytes().split(b"\n")[:-1]:
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict):
            line.pop("input_hash", None)
        out.append(line)
    return out


def stats(proc: subprocess.CompletedProcess) -> tuple[int, int, int, int]:
    match = STATS.match(proc.stderr.strip().splitlines()[-1])
    assert match, proc.stderr
    return tuple(int(g) for g in match.groups())


def single(text: str, model_dir: Path, env: dict[str, str], tmp_path: Path,
           flags: list[str] = (), input: str | None = None) -> subprocess.CompletedProcess:
    """`inferno score FILE --json` on one text (in a subprocess when `input` is given, as a job whose
    stdin is piped runs: its BLAS rounds as that process's does)."""
    path = tmp_path / "one.txt"
    path.write_bytes(text.encode("utf-8"))
    return run_score([str(path), "--json", "-m", str(model_dir), *flags], env, input=input)


def words(n: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(n))


# ------------------------------------------------------------------------------------- the outputs


def test_each_line_is_what_inferno_score_json_prints(model_dir, env, pipe, tmp_path):
    long_text = words(300)  # past the context of 128: the sliding window
    rows = [
        {"id": "plain", "text": "The quick brown fox jumps over the lazy dog."},
        "",  # blank: skipped, but it counts as a line
        {"text": "Hello, world!\n"},  # no id: its line number, 3
        {"id": 7, "text": "Caf\u00e9 cr\u00e8me \u2014 na\u00efve \U0001f600 text"},
        {"id": "long-strided", "text": long_text, "stride": 40},
        {"id": "long-default", "text": long_text},  # the run's --stride 50
        {"id": "ids", "text": [464, 2068, 7586, 21831]},  # token ids: "The quick brown fox"
        {"id": "two-tokens", "text": "Hi there"},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    proc = run_score([str(src), "-o", str(out), "-m", str(model_dir), "--stride", "50"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    data = out.read_bytes()
    assert data.isascii() and data.endswith(b"\n")
    lines = output_lines(out)
    assert [line["id"] for line in lines] == ["plain", 3, 7, "long-strided", "long-default", "ids",
                                              "two-tokens"]  # input order
    written, tokens, skipped, malformed = stats(proc)
    assert (written, skipped, malformed) == (7, 0, 0) and tokens == sum(len(line["ids"]) for line in lines)
    got = {line["id"]: line for line in lines}
    # Token ids score as the text they encode.
    assert pipe.encode("The quick brown fox") == [464, 2068, 7586, 21831]
    texts = {row.get("id", 3): row for row in rows if row}
    texts["ids"] = {"text": "The quick brown fox"}
    for rid, row in texts.items():
        expected = single(row["text"], model_dir, env, tmp_path, ["--stride", str(row.get("stride", 50))])
        assert expected.returncode == 0, expected.stderr
        assert set(got[rid]) == RESULT_KEYS
        assert got[rid] == {"id": rid, **json.loads(expected.stdout)}, rid  # the same numbers
    assert len(got["long-strided"]["ids"]) > pipe.config.n_positions
    assert (got["long-strided"]["stride"], got["long-default"]["stride"]) == (40, 50)
    assert got["long-strided"]["logprobs"] != got["long-default"]["logprobs"]


def test_stdin_and_the_default_stride(model_dir, env, tmp_path):
    texts = "".join(json.dumps({"id": i, "text": words(5 + i, i)}) + "\n" for i in range(3))
    out = tmp_path / "out.jsonl"
    proc = run_score(["-o", str(out), "-m", str(model_dir)], env, input=texts)  # FILE defaults to -
    assert proc.returncode == 0, proc.stderr
    lines = output_lines(out)
    assert [line["id"] for line in lines] == [0, 1, 2]
    for i, line in enumerate(lines):
        expected = json.loads(single(words(5 + i, i), model_dir, env, tmp_path, input="").stdout)
        assert line == {"id": i, **expected} and line["stride"] == 64  # half the context of 128


def test_too_short_texts_are_the_errors_inferno_score_gives(model_dir, env, tmp_path):
    rows = [{"id": "empty", "text": ""}, {"id": "one", "text": "Hi"}, {"id": "ok", "text": "Hi there"},
            {"id": "wide", "text": "Hi there", "stride": 128}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    proc = run_score([str(src), "-o", str(tmp_path / "out.jsonl"), "-m", str(model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    reports = dict(re.match(r"inferno score: .*in\.jsonl:(\d+): (.*)$", r).groups()
                   for r in proc.stderr.strip().splitlines()[:-1])
    alone_runs = {"1": ("", []), "2": ("Hi", []), "4": ("Hi there", ["--stride", "128"])}
    for line, (text, flags) in alone_runs.items():
        alone = single(text, model_dir, env, tmp_path, flags)
        assert_one_line_error(alone)
        assert alone.stderr.strip() == f"inferno: error: {reports.pop(line)}"
    assert reports == {}
    assert [line["id"] for line in output_lines(tmp_path / "out.jsonl")] == ["ok"]
    assert stats(proc)[2:] == (0, 3)


# ------------------------------------------------------------------------------------- bad input


MALFORMED = [
    # (what is written, what the report says)
    ({"id": "ok1", "text": "Hello there"}, None),
    ('{"id": "broken", "text": ', ("not valid JSON",)),
    ({"id": "typo", "txt": "Hello there"}, ("unknown key 'txt'", "did you mean 'text'", "known: id, text")),
    ({"id": "no-text"}, ('no "text"',)),
    ({"id": "number", "text": 42}, ("text must be a string or a list of token ids",)),
    ({"id": "bool-id", "text": [464, True]}, ("integers", "true")),
    ({"id": "outside", "text": [464, 50257]}, ("token id 50257", "vocabulary")),
    ({"id": "ok1", "text": "again and again"}, ('duplicate id "ok1"', "line 1")),
    ({"id": "stride", "text": "Hello there", "stride": 0}, ("stride must be an integer >= 1",)),
    ({"id": "one-token", "text": "a"}, ("at least 2 tokens", "got 1")),
    ([1, 2], ("expected a JSON object",)),
    ({"id": ["x"], "text": "Hello there"}, ("id must be a string or an integer",)),
    ('{"text": "a b", "text": "c d"}', ("'text' appears twice",)),
    ({"text": "Good morning to you"}, None),  # line 14
]


def test_malformed_lines_are_reported_and_skipped(model_dir, env, tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [row for row, _ in MALFORMED])
    proc = run_score(["in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert_line_reports(proc, "inferno score", "in.jsonl", MALFORMED)
    bad = [row for row, needles in MALFORMED if needles]
    assert stats(proc)[0] == 2 and stats(proc)[2:] == (0, len(bad))
    assert [line["id"] for line in output_lines(tmp_path / "out.jsonl")] == ["ok1", 14]


def test_strict_stops_before_out_is_touched(model_dir, env, tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [row for row, _ in MALFORMED])
    proc = run_score(["in.jsonl", "-o", "out.jsonl", "-m", str(model_dir), "--strict"], env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "in.jsonl:2: not valid JSON" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("inferno: error: --strict: ")
    assert "nothing was scored" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()
    # Lines only the model can reject (one token) count as well; an existing OUT keeps every byte.
    write_jsonl(tmp_path / "in2.jsonl", [{"id": "a", "text": "Hello there"}, {"id": "b", "text": "Hi"}])
    before = b'{"id": "x", "ids": [1, 2]}\n{"id": "a", "id'
    (tmp_path / "out.jsonl").write_bytes(before)
    proc = run_score(["in2.jsonl", "-o", "out.jsonl", "-m", str(model_dir), "--strict"], env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "in2.jsonl:2: scoring needs at least 2 tokens" in proc.stderr
    assert (tmp_path / "out.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["in.jsonl", "-o", "in.jsonl"], ("-o in.jsonl", "input file")),
        (["in.jsonl", "-o", "./in.jsonl"], ("input file",)),
        (["in.jsonl", "-o", "link.jsonl"], ("input file",)),  # a symbolic link to it
        (["in.jsonl", "-o", "no/such/dir/out.jsonl"], ("no/such/dir", "does not exist")),
        (["in.jsonl", "-o", "-"], ("-o: give a file",)),
        (["rows.parquet", "-o", "out.jsonl"], ("rows.parquet", "Parquet input needs --ray", "JSONL")),
        (["rows.data", "-o", "out.jsonl"], ("rows.data", "Parquet input needs --ray")),  # by its content
        (["folder", "-o", "out.jsonl"], ("folder", "a folder of inputs needs --ray")),
        (["s3://bucket/texts.jsonl", "-o", "out.jsonl"], ("needs --ray",)),
        (["nope.jsonl", "-o", "out.jsonl"], ("nope.jsonl",)),
        (["in.jsonl", "-o", "out.jsonl", "--workers", "2"], ("--workers needs --ray",)),
        (["in.jsonl", "--strict"], ("--strict needs -o",)),
        (["in.jsonl", "-o", "out.jsonl", "--stride", "0"], ("--stride",)),
    ],
)
def test_usage_errors(model_dir, env, tmp_path, args, needles):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "Hello there"}])
    content = src.read_bytes()
    if hasattr(os, "symlink"):
        (tmp_path / "link.jsonl").symlink_to(src)
    parquet = b"PAR1\x15\x04\x15\x10PAR1"  # a Parquet file's magic bytes at both ends
    (tmp_path / "rows.parquet").write_bytes(parquet)
    (tmp_path / "rows.data").write_bytes(parquet)
    (tmp_path / "folder").mkdir()
    write_jsonl(tmp_path / "folder" / "a.jsonl", [{"text": "Hello there"}])
    assert_one_line_error(run_score([*args, "-m", str(model_dir)], env, cwd=tmp_path), *needles)
    assert src.read_bytes() == content
    assert not (tmp_path / "out.jsonl").exists()


# ------------------------------------------------------------------------------------------- resuming


def test_resume_appends_only_the_missing_ids(model_dir, env, tmp_path):
    rows = [{"id": f"t{i}", "text": words(4 + i, i)} for i in range(5)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    # An earlier run wrote t1 and t3 (marked: a rescored line would not say "earlier run"), then died in
    # the middle of the line for t4.
    before = (json.dumps({"id": "t1", "perplexity": "earlier run"}) + "\n"
              + json.dumps({"id": "t3", "perplexity": "earlier run"}) + "\n"
              + '{"id": "t4", "ids": [262, 2').encode()
    out.write_bytes(before)
    args = [str(src), "-o", str(out), "-m", str(model_dir)]
    proc = run_score(args, env)
    assert proc.returncode == 0, proc.stderr
    assert "out.jsonl:3: a partial last line" in proc.stderr
    assert stats(proc)[0] == 3 and stats(proc)[2:] == (2, 0)
    after = out.read_bytes()
    assert after.startswith(before) and after[len(before):len(before) + 1] == b"\n"
    lines = output_lines(out)
    assert [line["id"] for line in lines] == ["t1", "t3", "t0", "t2", "t4"]
    by_id = {line["id"]: line for line in lines}
    assert by_id["t1"]["perplexity"] == by_id["t3"]["perplexity"] == "earlier run"
    for i in (0, 2, 4):
        assert by_id[f"t{i}"] == {"id": f"t{i}", **json.loads(single(words(4 + i, i), model_dir, env,
                                                                       tmp_path).stdout)}

    # Done: a rerun scores nothing and leaves every byte.
    proc = run_score(args, env)
    assert proc.returncode == 0, proc.stderr
    assert stats(proc)[0] == 0 and stats(proc)[2:] == (5, 0)
    assert out.read_bytes() == after
    # A new text in IN: only its line is appended.
    write_jsonl(src, [*rows, {"text": "one more text"}])
    proc = run_score(args, env)
    assert proc.returncode == 0, proc.stderr
    assert stats(proc)[0] == 1 and stats(proc)[2:] == (5, 0)
    grown = out.read_bytes()
    assert grown.startswith(after)
    assert [json.loads(raw)["id"] for raw in grown[len(after):].splitlines()] == [6]
    assert Counter(line["id"] for line in output_lines(out)) == Counter(["t0", "t1", "t2", "t3", "t4", 6])


# ------------------------------------------------------------------------------- in this process


def test_ctrl_c_leaves_only_complete_lines(model_dir, tmp_path, capsys, monkeypatch):
    import inferno.api

    src = write_jsonl(tmp_path / "in.jsonl", [{"text": words(6, i)} for i in range(5)])
    out = tmp_path / "out.jsonl"
    score, calls = inferno.api.Pipeline.score, []

    def interrupted_third(self, text, stride=None, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return score(self, text, stride, **kwargs)

    monkeypatch.setattr(inferno.api.Pipeline, "score", interrupted_third)
    assert main(["score", str(src), "-o", str(out), "-m", str(model_dir)]) == 130
    err = capsys.readouterr().err
    assert f"[interrupted: 2 of 5 texts written to {out}]" in err and "Traceback" not in err
    assert out.read_bytes().endswith(b"\n") and [line["id"] for line in output_lines(out)] == [1, 2]
    monkeypatch.undo()
    assert main(["score", str(src), "-o", str(out), "-m", str(model_dir)]) == 0  # the rest
    assert [line["id"] for line in output_lines(out)] == [1, 2, 3, 4, 5]


class BrokenBackend(NumpyBackend):
    name = "broken-score-test"
    description = "fails in the LM head"

    def lm_head(self, x, wte):
        raise FloatingPointError("the LM head broke")


def test_texts_the_backend_fails_are_reported_and_not_written(model_dir, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "Hello there"}])
    out = tmp_path / "out.jsonl"
    with registered(BrokenBackend) as name:
        code = main(["score", str(src), "-o", str(out), "-m", str(model_dir), "--backend", name])
    err = capsys.readouterr().err
    assert code == 1, err
    assert 'in.jsonl:1: id "a" failed: BackendError: ' in err and "the LM head broke" in err
    assert err.strip().splitlines()[-1].endswith("0 malformed, 1 failed (run again to retry them)]")
    assert out.read_bytes() == b""  # a later run retries it


class _Scored:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def to_dict(self) -> dict:
        return {"ids": self.ids}


class _FailingOnSomeTexts:
    """A pipeline whose `score` fails for the texts in `failing` and scores the others."""

    def __init__(self, failing: set[str]) -> None:
        self.failing, self.scored = failing, []

    def score(self, text, stride):
        self.scored.append(text)
        if text in self.failing:
            raise RuntimeError(f"cannot score {text}")
        return _Scored([1, 2, 3])


def test_each_failed_text_is_counted_and_the_texts_after_it_are_still_scored(tmp_path, monkeypatch):
    progress = _Progress(3, io.StringIO())
    ticks = iter(range(200, 300))
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) / 2)  # 100.0, 100.5, ... seconds
    pipe = _FailingOnSomeTexts({"a", "b"})
    todo = [ScoreRequest(rid, text, None, line) for line, (rid, text) in enumerate(
        [("x", "a"), ("y", "b"), ("z", "c")], start=1)]
    out = tmp_path / "out.jsonl"
    plan = JobPlan(pipe, todo, out, False, skipped=0, malformed=0, source="in.jsonl")
    said = []
    report = run_scoring(plan, progress, said.append)
    assert report.seconds == 1.0  # from the start (100.0) past the progress line's update (100.5) to 101.0
    assert pipe.scored == ["a", "b", "c"]
    assert (report.failed, report.written, report.tokens, report.interrupted) == (2, 1, 3, False)
    assert said == ['in.jsonl:1: id "x" failed: RuntimeError: cannot score a',
                    'in.jsonl:2: id "y" failed: RuntimeError: cannot score b']
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"id": "z", "ids": [1, 2, 3]}]


def test_a_malformed_row_still_claims_its_id_and_an_unknown_key_gets_a_hint_only_when_one_is_close():
    data = (b'{"id": "a", "txt": "x"}\n{"id": "a", "text": "y"}\n{"id": "b"}\n{"id": "b", "text": "z"}\n'
            b'{"zzz": 1}\n')
    requests, errors = parse_score_requests(data, None)
    assert requests == []
    assert errors == [(1, "unknown key 'txt' (did you mean 'text'? known: id, text, stride)"),
                      (2, 'duplicate id "a" (first on line 1)'),
                      (3, 'no "text" (the text to score, or a list of token ids)'),
                      (4, 'duplicate id "b" (first on line 3)'),
                      (5, "unknown key 'zzz' (known: id, text, stride)")]
    data = (b'{"id": "c", "text": [1, "2"]}\n{"id": "c", "text": "q"}\n'
            b'{"id": "d", "text": "q", "stride": "2"}\n{"id": "d", "text": "q"}\n'
            b'{"id": "e", "text": "q", "stride": 1}\n{"id": "f", "text": "q", "stride": 0}\n')
    requests, errors = parse_score_requests(data, None)
    assert [(r.id, r.stride) for r in requests] == [("e", 1)]  # the smallest stride
    assert errors == [(1, 'text: a list of token ids must hold integers, got "2"'),
                      (2, 'duplicate id "c" (first on line 1)'),
                      (3, 'stride must be an integer >= 1, got "2"'),
                      (4, 'duplicate id "d" (first on line 3)'),
                      (6, "stride must be an integer >= 1, got 0")]


def test_line_numbers_and_duplicate_ids():
    data = b'\xef\xbb\xbf{"text": "a"}\r\n\r\n{"text": "b", "id": "x", "stride": 9}\n{"text": "c", "id": 1}\n'
    requests, errors = parse_score_requests(data, 5)
    assert [(r.line, r.id, r.text, r.stride) for r in requests] == [(1, 1, "a", 5), (3, "x", "b", 9)]
    assert errors == [(4, "duplicate id 1 (first on line 1)")]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_texts_and_tokens():
    tty = _Terminal()
    progress = _Progress(2, tty, tqdm=None, desc="inferno score", unit="text", items="texts", tokens="tokens")
    progress.update(5)
    progress.update(7)
    progress.close()
    text = tty.getvalue()
    assert "\r\x1b[K[1/2 texts, 5 tokens, " in text and "\r\x1b[K[2/2 texts, 12 tokens, " in text


# ------------------------------------------------------------------------------------------- no Ray


#: The command in a fresh interpreter, with Ray unimportable when asked (as if not installed); prints
#: on stdout the Ray modules that got imported.
SCRIPT = """
import json, sys
if {hide}:
    for name in ("ray", "ray.data"):
        sys.modules[name] = None
from inferno.cli import main
code = main({argv})
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "ray" and sys.modules[m] is not None)))
sys.exit(code)
"""


@pytest.mark.parametrize("hide", [False, True], ids=["ray-importable", "ray-missing"])
def test_ray_is_never_imported(model_dir, env, tmp_path, hide):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "Hello there"}])
    out = tmp_path / "out.jsonl"
    argv = ["score", str(src), "-o", str(out), "-m", str(model_dir)]
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(hide=hide, argv=argv)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert [line["id"] for line in output_lines(out)] == ["a"]
