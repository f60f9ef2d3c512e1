"""`inferno batch --ray` and `inferno score --ray`, run as users run them (subprocesses connecting to a
local Ray cluster): every output row is the single-process command's row for that request, each id
once; malformed rows are reported with file:line and skipped (or, with --strict, stop the job before
OUT exists); a worker killed mid-job is retried and nothing is lost or written twice; folders of JSONL
and Parquet files are read, their rows named by file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from ray_helpers import (
    COMMAND_TIMEOUT,
    INFERNO,
    TIMINGS,
    processes,
    reports,
    rows_by_id,
    run,
    stats,
    wait_for,
    write_jsonl,
)

from inferno.api import load
from inferno.jobs.generate import parse_line
from inferno.jobs.lines import LineError, line_digest

pytestmark = pytest.mark.usefixtures("ray_address")

PROMPTS = ["The quick brown fox", "Once upon a time", "In a shocking finding, scientists",
           "Q: What is 2+2?\nA:", "def fibonacci(n):", "Hello", ""]


def batch_requests(n: int) -> list[dict]:
    """`n` requests that between them use every kind of field: greedy and sampled, stop strings, logit
    bias, penalties, logprobs, prompts as ids, unconditional prompts, rows without an id."""
    rows = []
    for i in range(n):
        r: dict = {"id": f"r{i}", "prompt": f"{PROMPTS[i % len(PROMPTS)]} {i}".strip(),
                   "max_new_tokens": 3 + i % 8}
        if i % 3 == 1:
            r.update(temperature=0.9, top_k=40, seed=i)
        elif i % 3 == 2:  # top-p within a top-k: see same_rows
            r.update(temperature=1.2, top_k=50, top_p=0.9, seed=1000 + i, repetition_penalty=1.3,
                     presence_penalty=0.5)
        if i % 10 == 0:
            r["logprobs"] = 2
        if i % 17 == 0:
            r["prompt"] = [464, 2068, 7586, i]
        if i % 19 == 0:
            r["stop"] = [" the", "\n"]
        if i % 31 == 0:
            r["logit_bias"] = {"13": -100, "262": 5}
        if i % 23 == 0:
            del r["id"]  # its line number stands in
        rows.append(r)
    return rows


MALFORMED = ['{"id": "bad-json", "prompt": ', '{"id": "r5", "prompt": "a duplicate id"}',
             '{"id": "typo", "prompt": "x", "temprature": 1}',
             '{"id": "long", "prompt": "' + "hi " * 200 + '"}',
             '{"id": "unknown-token", "prompt": [50300]}', '[1, 2]']


def with_malformed(rows: list) -> list:
    out = list(rows)
    for k, bad in enumerate(MALFORMED):
        out.insert(7 + 29 * k, bad)
    return out


def same_rows(a: dict, b: dict) -> bool:
    """Equal, logprobs up to float32 rounding. The engine's float32 sums depend on which sequences share
    a step (the single-process command's own rows move as much between --slots 8 and 16), so logprobs
    agree to ~1e-6, and a draw landing that close to a boundary would pick another token: the requests
    sample from at most top_k candidates, where that does not happen, rather than from a whole flat
    random distribution, where it does (~1% of top-p draws over 50,257 tokens)."""
    if {k: v for k, v in a.items() if k != "logprobs"} != {k: v for k, v in b.items() if k != "logprobs"}:
        return False
    def entries(row: dict) -> list[tuple]:
        return [(t["id"], t["text"], t["logprob"]) for x in row.get("logprobs", []) for t in [x, *x["top"]]]

    p, q = entries(a), entries(b)
    return len(p) == len(q) and all(i == j and s == t and abs(u - v) < 1e-4
                                    for (i, s, u), (j, t, v) in zip(p, q, strict=True))


def greedy_tie(pipeline, request: dict, a: dict, b: dict) -> bool:
    """Whether two greedy rows part where the model's two best tokens are tied within float32 rounding
    (the logits of this random model once came 2.4e-6 apart): either token is then the right one."""
    if request is None or {"temperature", "logit_bias"} & request.keys():
        return False
    if a["prompt_ids"] != b["prompt_ids"]:
        return False
    n = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"], strict=False)) if x != y), None)
    if n is None:
        return False
    logits = np.asarray(pipeline.logits(a["prompt_ids"] + a["ids"][:n]), dtype=np.float64)[-1]
    return max(logits) - min(logits[a["ids"][n]], logits[b["ids"][n]]) < 1e-4


def ray_flags(address: str, model_dir, *extra: str) -> list[str]:
    return ["-m", str(model_dir), "--ray", address, *extra]


def test_batch_job_equals_the_single_process_command(ray_address, ray_model_dir, env, tmp_path):
    src = write_jsonl(tmp_path / "requests.jsonl", with_malformed(batch_requests(200)))
    single = run(["batch", str(src), "-o", str(tmp_path / "single.jsonl"), "-m", str(ray_model_dir)], env)
    assert single.returncode == 0, single.stderr
    ray = run(["batch", str(src), "-o", str(tmp_path / "ray.jsonl"),
               *ray_flags(ray_address, ray_model_dir, "--workers", "2", "--slots", "8")], env)
    assert ray.returncode == 0, ray.stderr[-3000:]

    expected, got = rows_by_id(tmp_path / "single.jsonl"), rows_by_id(tmp_path / "ray.jsonl")
    assert len(expected) == 200
    assert got.keys() == expected.keys()
    requests = {json.dumps(r["id"]): r for r in batch_requests(200) if "id" in r}
    differ = [k for k in expected if not same_rows(got[k], expected[k])]
    pipeline = load(str(ray_model_dir)) if differ else None
    assert [(k, expected[k]["ids"], got[k]["ids"]) for k in differ
            if not greedy_tie(pipeline, requests.get(k), expected[k], got[k])] == []
    assert sum(1 for k in got if k.isdigit()) == 9  # the rows without an id: their line numbers
    # The same malformed lines, reported as file:line with the same messages. The rows the workers find
    # wrong (too long, ids outside the vocabulary) are reported as their blocks come back, in any order.
    assert sorted(reports(ray.stderr, "inferno batch")) == sorted(reports(single.stderr, "inferno batch"))
    assert len(reports(ray.stderr, "inferno batch")) == len(MALFORMED)
    written, tokens, skipped, malformed = stats(ray.stderr)
    assert (written, skipped, malformed) == (200, 0, len(MALFORMED))
    assert tokens == sum(len(r["ids"]) for r in got.values())

    # Run again: every id is in OUT already, nothing is added.
    before = (tmp_path / "ray.jsonl").read_bytes()
    again = run(["batch", str(src), "-o", str(tmp_path / "ray.jsonl"),
                 *ray_flags(ray_address, ray_model_dir)], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert stats(again.stderr)[:3] == (0, 0, 200)
    assert (tmp_path / "ray.jsonl").read_bytes() == before


def test_a_worker_killed_mid_job_is_retried_and_nothing_is_lost_or_repeated(ray_address, ray_model_dir, env,
                                                                           tmp_path):
    rows = [{"id": i, "prompt": f"{PROMPTS[i % 6]} {i}", "max_new_tokens": 40, "stop_at_eos": False,
             **({"temperature": 1.0, "top_k": 40, "seed": i} if i % 2 else {})} for i in range(200)]
    src = write_jsonl(tmp_path / "requests.jsonl", rows)
    out = tmp_path / "ray.jsonl"
    title = "MapBatches(_Generator)"
    wait_for("the workers of earlier jobs to exit", lambda: not processes(title), 60)
    proc = subprocess.Popen([*INFERNO, "batch", str(src), "-o", str(out),
                             *ray_flags(ray_address, ray_model_dir, "--workers", "2", "--slots", "2")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def lines() -> int:
            return out.read_bytes().count(b"\n") if out.exists() else 0

        wait_for("the job to write its first rows", lambda: lines() >= 20 or proc.poll() is not None, 120)
        workers = processes(title)
        assert proc.poll() is None and len(workers) == 2, (workers, proc.poll())
        written_at_kill = lines()
        os.kill(workers[0], signal.SIGKILL)  # what the OOM killer would do
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=COMMAND_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    assert proc.returncode == 0, stderr[-3000:]
    assert written_at_kill < 200 and time.monotonic() > killed_at
    assert workers[0] not in processes(title)

    got = rows_by_id(out)  # fails on an id written twice
    assert sorted(json.loads(k) for k in got) == list(range(200))
    assert stats(stderr)[0] == 200
    single = run(["batch", str(src), "-o", str(tmp_path / "single.jsonl"), "-m", str(ray_model_dir)], env)
    assert single.returncode == 0, single.stderr
    assert got == rows_by_id(tmp_path / "single.jsonl")


def test_a_folder_of_jsonl_and_parquet_files(ray_address, ray_model_dir, env, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "in"
    a = [{"id": "a1", "prompt": "The cat", "max_new_tokens": 5},
         {"prompt": "No id here", "max_new_tokens": 4},
         {"id": "a3", "prompt": [464, 3797], "temperature": 0.8, "seed": 3, "max_new_tokens": 6}]
    b = [{"id": "b1", "prompt": "A dog", "max_new_tokens": 5, "seed": None},
         {"prompt": "Also no id", "max_new_tokens": 3},
         {"id": "b3", "prompt": "Bad", "temperature": -1.0}]
    write_jsonl(folder / "a.jsonl", a)
    (folder / "sub").mkdir()
    columns = {key: [r.get(key) for r in b] for key in dict.fromkeys(k for r in b for k in r)}  # absent: null
    pq.write_table(pa.table(columns), folder / "sub" / "b.parquet")
    (folder / "notes.txt").write_text("not an input file\n")
    proc = run(["batch", str(folder), "-o", str(tmp_path / "ray.jsonl"),
                *ray_flags(ray_address, ray_model_dir)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Each line carries its input line's fingerprint; the single-process run below reads other lines.
    got = rows_by_id(tmp_path / "ray.jsonl", (*TIMINGS, "input_hash"))
    # Rows without an id are named by their file (inside the folder) and line, or Parquet row.
    assert set(got) == {'"a1"', '"a.jsonl:2"', '"a3"', '"b1"', '"sub/b.parquet:2"'}
    with pytest.raises(LineError) as bad:
        parse_line(json.dumps(b[2]), 3, 50, True)
    parquet = folder / "sub" / "b.parquet"
    assert reports(proc.stderr, "inferno batch") == [f"inferno batch: {parquet}:3: {bad.value}"]

    # The same rows through the single-process command give the same lines.
    named = [{**r, "id": r.get("id", name)} for r, name in zip(a + b[:2], ["a1", "a.jsonl:2", "a3", "b1",
                                                                            "sub/b.parquet:2"], strict=True)]
    src = write_jsonl(tmp_path / "same.jsonl", [{k: v for k, v in r.items() if v is not None} for r in named])
    single = run(["batch", str(src), "-o", str(tmp_path / "single.jsonl"), "-m", str(ray_model_dir)], env)
    assert single.returncode == 0, single.stderr
    assert got == rows_by_id(tmp_path / "single.jsonl", (*TIMINGS, "input_hash"))


def test_strict_stops_before_anything_runs(ray_address, ray_model_dir, env, tmp_path):
    rows = [{"id": i, "prompt": f"prompt {i}", "max_new_tokens": 4} for i in range(6)]
    rows.insert(3, {"id": "long", "prompt": "hi " * 200})  # only the model can tell: its context is 128
    src = write_jsonl(tmp_path / "requests.jsonl", rows)
    out = tmp_path / "ray.jsonl"
    proc = run(["batch", str(src), "-o", str(out), "--strict", *ray_flags(ray_address, ray_model_dir)], env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"inferno batch: error: --strict: 1 malformed row in {src}; nothing was run")
    assert not out.exists()
    # The line and the message are the single-process command's.
    single = run(["batch", str(src), "-o", str(out), "--strict", "-m", str(ray_model_dir)], env)
    assert single.returncode == 2 and not out.exists()
    assert reports(proc.stderr, "inferno batch") == reports(single.stderr, "inferno batch")
    assert [r.split(": ")[1] for r in reports(proc.stderr, "inferno batch")] == [f"{src}:4"]


# ------------------------------------------------------------------------------------------ scoring


def score_rows(n: int) -> list[dict]:
    words = "the quick brown fox jumps over the lazy dog while a cat watches from the warm window".split()
    rows = []
    for i in range(n):
        text = " ".join(words[(i + k) % len(words)] for k in range(3 + 11 * i % 190))
        r: dict = {"id": f"t{i}", "text": text + ("\n" if i % 4 == 0 else "")}
        if i % 5 == 0:
            r["stride"] = 16 + i
        if i % 9 == 0:
            r["text"] = [464, 2068, 7586, 21831, i, 625]
        rows.append(r)
    return rows


def test_score_job_equals_the_single_process_command(ray_address, ray_model_dir, env, tmp_path, capsys):
    from threadpoolctl import threadpool_limits

    import inferno
    from inferno.cli import main

    rows = score_rows(50)
    bad = ['{"id": "no-text"}', '{"id": "one-token", "text": "a"}', '{"id": "t3", "text": "a duplicate id"}',
           '{"id": "wide", "text": "a b c d", "stride": 500}', '{"id": "typo", "txt": "x"}']
    src = write_jsonl(tmp_path / "texts.jsonl", rows[:20] + bad + rows[20:])
    proc = run(["score", str(src), "-o", str(tmp_path / "ray.jsonl"),
                *ray_flags(ray_address, ray_model_dir, "--workers", "2")], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = rows_by_id(tmp_path / "ray.jsonl")
    assert set(got) == {json.dumps(r["id"]) for r in rows}
    # As `inferno score -o` writes them: with the fingerprint of the input line (--json has none).
    lines: dict = {}
    for line in src.read_text().splitlines():  # the first line of an id (a later one is a duplicate)
        lines.setdefault(json.loads(line)["id"], line)
    for r in rows:
        assert got[json.dumps(r["id"])].pop("input_hash") == line_digest(lines[r["id"]].encode())
    assert sorted(line.split(": ", 2)[1] for line in reports(proc.stderr, "inferno score")) == [
        f"{src}:{n}" for n in range(21, 26)]
    assert stats(proc.stderr)[2:] == (0, len(bad))

    # `inferno score FILE --json` on each text (here, in this process, on one BLAS thread like a worker).
    pipe = inferno.load(ray_model_dir, "numpy", download=False)
    with threadpool_limits(limits=1, user_api="blas"):
        for r in rows:
            if isinstance(r["text"], list):  # token ids: what the command would print for them
                expected = pipe.score(r["text"], r.get("stride")).to_dict()
            else:
                path = tmp_path / "one.txt"
                path.write_text(r["text"], encoding="utf-8")
                stride = ["--stride", str(r["stride"])] if "stride" in r else []
                assert main(["score", str(path), "--json", "-m", str(ray_model_dir), *stride]) == 0
                expected = json.loads(capsys.readouterr().out)
            assert got[json.dumps(r["id"])] == {"id": r["id"], **expected}, r["id"]
