"""Batch jobs on Ray Data: ``inferno batch --ray`` and ``inferno score --ray``.

    inferno batch prompts.jsonl -o results.jsonl --ray                 # Ray on this machine
    inferno batch prompts/ -o results.jsonl --ray auto --workers 8 --slots 16
    inferno score texts.jsonl -o scores.jsonl --ray ray://head:10001 --workers 4

The same job as the single-process command, spread over a pool of Ray actors ("workers"), each of which
loads the model once and runs one continuous-batching engine with ``--slots`` sequences:

    read_binary_files(IN) ─▶ flat_map: each file's lines (or Parquet rows) checked as inferno batch does
        ─▶ materialize ─▶ the driver reads every row's id once: duplicates, ids already in OUT, --strict
        ─▶ filter ─▶ repartition(slots rows a block) ─▶ map_batches over the actor pool (the engine)
        ─▶ the driver appends each result row to OUT, once per id

Input: a JSONL file (``.jsonl``/``.ndjson``), a Parquet file, or a folder of them (every such file
below it, in sorted order). Generation rows are those of ``inferno batch`` (see `inferno.jobs.generate`); a
Parquet row is read as the JSON object of its non-null columns, and its number (from 1) stands in for
the line. Scoring rows are ``{"id": ..., "text": "..."}`` with an optional ``"stride"`` (default:
``--stride``); ``text`` may also be a list of token ids. A row without an id gets its line number when
IN is one file (as ``inferno batch`` gives it), else ``"NAME:LINE"`` with NAME the file's path inside
the folder. Scoring rows are read and checked by `inferno.jobs.score`, as ``inferno score -o`` without
--ray reads them.

Output: the single-process command's lines, appended to one JSONL file by the driver: generation rows
are ``{"id": ..., **the fields of inferno --json}`` (a line in OpenAI's Batch API format, ``custom_id``,
``method``, ``url``, ``body``, gets that API's output line, as ``inferno batch`` writes it), scoring rows
``{"id": ..., **the fields of inferno score --json}``. Rows come in the order their batches finish
(input order within a batch): join on ``id``. Each id is written once: a batch that Ray retries after a
worker died gives the same rows again (same seeds, same tokens) and the driver drops the repeats. OUT is
resumed like ``inferno batch``'s.

Malformed rows are reported as ``PROG: FILE:LINE: what`` and skipped; with ``--strict`` any malformed row
ends the command (exit code 2) before anything is generated, and OUT is not touched. Rows wrong in
themselves are found while reading; rows the model cannot take (prompt length, token ids, a stride past
the context) by the workers, in a checking pass first with ``--strict`` and otherwise as they come.

Same results: a row is what the single-process command gives for that request, as exactly as that
command agrees with itself at another ``--slots``: the engine's float32 sums depend on which sequences
share a step, so logprobs agree to ~1e-6 and a draw that lands that close to a boundary can pick another
token (seen on flat random distributions with top-p over the whole vocabulary, never with top-k in the
tests). Bit-equal sums also need the same BLAS threads: a worker has ``--cpus-per-worker`` of them.

Each worker holds its own weights (~0.5 GB at 124M) and KV slots. The driver holds every row's id once
(to find duplicates) and writes OUT; the rows themselves stay in Ray's object store.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray
import ray.data

from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_SLOTS
from inferno.errors import squash
from inferno.integrations import limit_blas_to_ray_cpus
from inferno.jobs.generate import check_request, parse_line
from inferno.jobs.lines import JobError, LineError, line_digest, split_lines
from inferno.jobs.openai_batch import response_line, token_bytes
from inferno.jobs.output import INPUT_HASH, Output, check_output, read_done
from inferno.jobs.progress import DeferInterrupts, JobReport
from inferno.jobs.score import check_score_request, parse_score_line

GENERATE, SCORE = "generate", "score"
#: What a folder's files may be.
SUFFIXES = (".jsonl", ".ndjson", ".parquet")
#: Batches an actor works on at once: while one waits for its last sequences, the other's fill the
#: engine's free slots (both feed the same engine).
CALLS_PER_WORKER = 2
#: Seconds between looks at a worker's engine while its sequences run.
POLL_SECONDS = 0.05


class WorkerError(RuntimeError):
    """Why a worker cannot start, in one line (plain, so that Ray carries it back to the driver)."""


@dataclass
class JobConfig:
    """What every worker needs: the model, its backend, and the job's defaults."""

    kind: str = GENERATE  # GENERATE or SCORE
    model_dir: str | None = None
    backend: str | None = None
    threads: int | None = None
    workers: int = 1
    cpus_per_worker: float = 1.0
    slots: int = DEFAULT_SLOTS
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    max_new_tokens: int = 50
    stop_at_eos: bool = True
    stride: int | None = None
    strict: bool = False


# ------------------------------------------------------------------------------------------ input


def input_files(name: str) -> tuple[list[str], str | None]:
    """The files of IN (absolute paths, or IN itself for a URI) and the folder their names are relative
    to (None: IN is one file)."""
    if "://" in name:  # cloud storage: Ray Data lists it
        return [name], None if name.endswith(SUFFIXES) else name
    path = Path(name)
    if path.is_file():
        return [str(path.resolve())], None
    if path.is_dir():
        files = sorted(str(p.resolve()) for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise JobError(f"{name}: no {', '.join(SUFFIXES)} files in this folder")
        return files, str(path.resolve())
    if name == "-":
        raise JobError("--ray reads files: give a JSONL or Parquet file, or a folder of them (not stdin)")
    raise JobError(f"{name}: no such file or folder")


def _relative(path: str, root: str) -> str:
    bare = root.split("://", 1)[-1].rstrip("/")
    path = path.split("://", 1)[-1]
    return path[len(bare) + 1:] if path.startswith(bare + "/") else path


def _row_texts(path: str, data: bytes) -> Iterable[tuple[int, str | None, str]]:
    """(line, text, problem) of every non-blank line of a JSONL file, or every row of a Parquet file."""
    if path.endswith(".parquet"):
        import io

        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(io.BytesIO(data)).to_pylist()
        except Exception as exc:  # pyarrow's errors name what is wrong with the file
            yield 0, None, f"not a readable Parquet file: {exc}"
            return
        for i, row in enumerate(rows, 1):
            try:
                yield i, json.dumps({k: v for k, v in row.items() if v is not None}), ""
            except (TypeError, ValueError) as exc:
                yield i, None, f"a value that JSON cannot hold: {exc}"
        return
    for line, raw in split_lines(data):
        try:
            yield line, raw.decode("utf-8"), ""
        except UnicodeDecodeError as exc:
            yield line, None, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"


def _parse_file(row: dict[str, Any], *, kind: str, name: str, root: str | None,
                defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Ray Data's flat_map over files: one row per request, with its id (as JSON, the key the driver
    checks for duplicates) or what is wrong with it."""
    path = str(row["path"])
    rel = None if root is None else _relative(path, root)
    source = name if rel is None else os.path.join(name, rel)
    out = []
    for line, text, problem in _row_texts(path, row["bytes"]):
        rid: str | int | None = None
        if text is not None:
            try:
                if kind == SCORE:
                    rid = parse_score_line(text, line, defaults["stride"]).id
                else:
                    rid = parse_line(text, line, defaults["max_new_tokens"], defaults["stop_at_eos"]).id
            except LineError as exc:
                rid, problem = exc.id, str(exc)
            if rel is not None and rid == line and _no_id(text):
                rid = f"{rel}:{line}"
        out.append({"source": source, "line": line, "key": "" if rid is None else json.dumps(rid),
                    "request": text or "", "error": problem})
    return out


def _no_id(text: str) -> bool:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return True
    return not isinstance(obj, dict) or "id" not in obj


# ---------------------------------------------------------------------------------------- workers


class _Worker:
    """A Ray actor of the pool: the model, loaded once, on as many BLAS threads as Ray gave it CPUs."""

    def __init__(self, config: dict[str, Any]) -> None:
        import inferno
        from inferno.backends.registry import get_backend

        self.config = JobConfig(**config)
        self.blas_threads = limit_blas_to_ray_cpus(self.config.cpus_per_worker)
        c = self.config
        try:
            backend = get_backend(c.backend, threads=c.threads) if c.threads is not None else c.backend
            self.pipe = inferno.load(c.model_dir, backend, download=False)
        except Exception as exc:  # our loaders' errors name the file, tensor or flag: keep only that
            lines = getattr(exc, "lines", None) or str(exc).splitlines() or [type(exc).__name__]
            raise WorkerError("a worker cannot load the model: " + "; ".join(
                line.strip() for line in lines if line.strip())) from None

    def _request(self, row: dict[str, Any]) -> Any:
        """The row's request (a `Request` or a `ScoreRequest`) with its id from the key; `LineError`."""
        c = self.config
        line, text = int(row["line"]), str(row["request"])
        req = (parse_score_line(text, line, c.stride) if c.kind == SCORE
               else parse_line(text, line, c.max_new_tokens, c.stop_at_eos))
        req.id = json.loads(str(row["key"]))
        return req

    def _check(self, req: Any) -> None:
        """The model's checks (prompt ids and length, option ids; a scoring text's length and stride)."""
        if self.config.kind == GENERATE:
            check_request(self.pipe, req)
            return
        check_score_request(self.pipe, req)  # what the single-process command checks


def _rows(batch: dict[str, Any]) -> list[dict[str, Any]]:
    names = list(batch)
    return [dict(zip(names, values, strict=True)) for values in zip(*(batch[n] for n in names), strict=True)]


def _line(row: dict[str, Any], obj: dict[str, Any]) -> str:
    """An output line: `obj` with the fingerprint of its input line, as the single-process command writes
    it (`jobs.output.INPUT_HASH`)."""
    return json.dumps({**obj, INPUT_HASH: line_digest(str(row["request"]).encode())})


def _result(row: dict[str, Any], kind: str, out: str = "", tokens: int = 0, message: str = "") -> dict:
    return {"source": str(row["source"]), "line": int(row["line"]), "key": str(row["key"]), "kind": kind,
            "out": out, "tokens": tokens, "message": message}


def _columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    names = ("source", "line", "key", "kind", "out", "tokens", "message")
    return {n: [r[n] for r in rows] for n in names}


class _Checker(_Worker):
    """--strict: the model's checks of every row, before anything runs; gives the rows that fail."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        out = []
        for row in _rows(batch):
            try:
                self._check(self._request(row))
            except LineError as exc:
                out.append(_result(row, "malformed", message=str(exc)))
        return _columns(out)


class _Generator(_Worker):
    """Generation: every row of a batch goes into this actor's one engine; a row per request comes out."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        c = self.config
        self.engine = self.pipe.engine(slots=c.slots, max_queue=None, prefill_chunk=c.prefill_chunk)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        from inferno.generate import GenerationError
        from inferno.options import OptionError

        pending, out = [], []
        for row in _rows(batch):
            try:
                req = self._request(row)
                self._check(req)
                handle = self.pipe.submit(self.engine, req.prompt_ids, req.max_new_tokens,
                                          stop_at_eos=req.stop_at_eos, options=req.options)
            except (LineError, GenerationError, OptionError) as exc:
                out.append(_result(row, "malformed", message=str(exc)))
                continue
            pending.append((row, req, handle))
        decode = self.pipe.tokenizer.decode

        def token_text(i: int) -> str:
            return decode([i])

        for row, req, handle in pending:
            while not handle.wait(POLL_SECONDS):
                if not self.engine.alive:  # it fails requests rather than dying; never wait forever
                    raise RuntimeError("the engine's step loop stopped with requests in flight")
            if handle.error is not None:
                reason = squash(handle.error)
                out.append(_result(row, "failed", message=f"id {json.dumps(req.id)} failed: "
                                   f"{type(handle.error).__name__}: {reason}"))
                continue
            result = handle.result()
            line = {"id": req.id, **result.to_dict(token_text)}
            if req.openai is not None:  # a Batch API line: that API's output line, as `inferno batch` writes
                line = response_line(req.id, req.openai, req.prompt_ids, line, token_text,
                                     token_bytes(self.pipe.tokenizer))
            out.append(_result(row, "ok", _line(row, line), result.new_tokens))
        return _columns(out)


class _Scorer(_Worker):
    """Scoring: `Pipeline.score` of each row's text, what ``inferno score --json`` prints, with the id."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        out = []
        for row in _rows(batch):
            try:
                req = self._request(row)
                self._check(req)
            except LineError as exc:
                out.append(_result(row, "malformed", message=str(exc)))
                continue
            result = self.pipe.score(req.text, req.stride)
            out.append(_result(row, "ok", _line(row, {"id": req.id, **result.to_dict()}), len(result.ids)))
        return _columns(out)


# ----------------------------------------------------------------------------------------- driver


def connect(address: str | None) -> bool:
    """Connect to Ray (`address`: None for ``ray.init()``'s default: RAY_ADDRESS, a Ray started on this
    machine, else a new local one; "auto", "HOST:PORT" or "ray://HOST:PORT"). True when this call
    connected (the caller disconnects), False when the process already was."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = address or "a local Ray"
        message = squash(exc)
        raise JobError(f"--ray: cannot connect to {where}: {message}") from None
    return True


def _same_machine() -> bool:
    """Whether every node of the cluster is this machine, so that its workers see the driver's files."""
    here = ray.util.get_node_ip_address()
    return all(node["NodeManagerAddress"] == here for node in ray.nodes() if node.get("Alive"))


def _worker_args(config: JobConfig) -> dict[str, Any]:
    return {"fn_constructor_kwargs": {"config": asdict(config)}, "num_cpus": config.cpus_per_worker,
            "batch_size": config.slots}


class Job:
    """One batch job on Ray Data, from the input files to OUT; see the module's docstring."""

    def __init__(self, config: JobConfig, input_name: str, output_name: str,
                 report: Callable[[str], None]) -> None:
        self.config = config
        self.input_name = input_name
        self.out_path = check_output(output_name, input_name)
        self.output_name = output_name
        self.files, self.root = input_files(input_name)
        self.report_line = report
        self.result = JobReport()

    def say(self, message: str) -> None:
        self.result.messages.append(message)
        self.report_line(message)

    def run(self) -> JobReport:
        if _same_machine():
            self._preflight()
        done = read_done(self.out_path)
        for note in done.notes:
            self.say(f"{self.output_name}:{note}")
        c = self.config
        defaults = {"max_new_tokens": c.max_new_tokens, "stop_at_eos": c.stop_at_eos, "stride": c.stride}
        extensions = [suffix.lstrip(".") for suffix in SUFFIXES]  # what Ray Data lists in a cloud folder
        files = ray.data.read_binary_files(self.files, include_paths=True, file_extensions=extensions)
        where = {"kind": c.kind, "name": self.input_name, "root": self.root, "defaults": defaults}
        parsed = files.flat_map(_parse_file, fn_kwargs=where).materialize()
        errors, drop, todo = self._index(parsed, done.ids)
        self._report(errors)
        self.result.malformed += len(errors)
        if c.strict and errors:
            raise JobError(f"--strict: {_count(len(errors), 'malformed row')} in {self.input_name}; "
                           "nothing was run")
        if not todo:
            return self.result
        # Cut into blocks of one batch before the actors start, so that no task competes with them for
        # the CPUs they hold (a filter waiting for a CPU behind two busy actors never runs).
        rows = parsed.map_batches(_drop_rows, fn_kwargs={"drop": drop}, batch_size=None) if drop else parsed
        rows = rows.repartition(target_num_rows_per_block=c.slots).materialize()
        del parsed
        if c.strict:
            late = self._strict_checks(rows)
            self._report(late)
            if late:
                raise JobError(f"--strict: {_count(len(late), 'malformed row')} in {self.input_name}; "
                               "nothing was run")
        self._run_workers(rows, done.needs_newline)
        return self.result

    def _preflight(self) -> None:
        """When the workers share this machine's files: find (or download, as ``inferno batch`` does) the
        model here, once, and check the backend, so that a missing file is the command's own error
        rather than every worker's. The workers then load the folder found."""
        from inferno.backends.registry import get_backend
        from inferno.models.names import parse_model_name
        from inferno.models.resolve import resolve_model_dir

        c = self.config
        if parse_model_name(c.model_dir).kind != "random":  # random weights: each worker builds them
            c.model_dir = str(resolve_model_dir(c.model_dir))
        get_backend(c.backend, **({} if c.threads is None else {"threads": c.threads})).close()

    def _index(self, ds: Any, done_ids: set) -> tuple[list[tuple[str, int, str]], set, int]:
        """Every row's id once, in file and line order: malformed rows, duplicate ids (the later row is
        the error), ids already in OUT; the (source, line) of the rows not to run, and how many run."""
        rows = sorted((r["source"], int(r["line"]), r["key"], r["error"])
                      for r in ds.select_columns(["source", "line", "key", "error"]).iter_rows())
        done_keys = {json.dumps(i) for i in done_ids}
        first: dict[str, tuple[str, int]] = {}
        errors, drop = [], set()
        for source, line, key, error in rows:
            if key and key in first:
                where = first[key]
                at = f"line {where[1]}" if where[0] == source else f"{where[0]}:{where[1]}"
                error = f"duplicate id {key} (first on {at})"
            elif key:
                first[key] = (source, line)
            if error:
                errors.append((source, line, error))
                drop.add((source, line))
            elif key in done_keys:
                self.result.skipped += 1
                drop.add((source, line))
        return errors, drop, len(rows) - len(drop)

    def _report(self, errors: list[tuple[str, int, str]]) -> None:
        for source, line, message in sorted(errors):
            self.say(f"{source}:{line}: {message}")

    def _pool(self, calls: int) -> Any:
        return ray.data.ActorPoolStrategy(size=self.config.workers, max_concurrent_calls_per_actor=calls,
                                          enable_true_multi_threading=calls > 1)

    def _strict_checks(self, rows: Any) -> list[tuple[str, int, str]]:
        checked = rows.map_batches(_Checker, compute=self._pool(1), **_worker_args(self.config))
        return [(r["source"], int(r["line"]), r["message"]) for r in _worker_rows(checked)]

    def _run_workers(self, rows: Any, needs_newline: bool) -> None:
        c, res = self.config, self.result
        worker, calls = (_Scorer, 1) if c.kind == SCORE else (_Generator, CALLS_PER_WORKER)
        results = rows.map_batches(worker, compute=self._pool(calls), **_worker_args(c))
        written: set[str] = set()
        output: Output | None = None  # opened with the first row: a job that fails to start leaves OUT
        interrupts = DeferInterrupts()
        start = time.perf_counter()
        try:
            with interrupts:
                for r in _worker_rows(results):
                    if r["kind"] == "malformed":
                        res.malformed += 1
                        self.say(f"{r['source']}:{r['line']}: {r['message']}")
                    elif r["kind"] == "failed":
                        res.failed += 1
                        self.say(f"{r['source']}:{r['line']}: {r['message']}")
                    elif r["key"] in written:
                        res.repeated += 1
                    else:
                        if output is None:
                            output = Output(self.out_path, needs_newline)
                        with interrupts.critical():  # written and counted, or neither
                            output.write_line(r["out"])
                            written.add(r["key"])
                            res.written += 1
                            res.tokens += int(r["tokens"])
        except KeyboardInterrupt:
            res.interrupted = True
        finally:
            if output is not None:
                output.close()
            res.seconds = time.perf_counter() - start


def _drop_rows(batch: dict[str, Any], drop: set) -> dict[str, Any]:
    """The rows of a batch not in `drop` ((source, line) of the malformed, duplicate and done rows)."""
    keep = [(str(s), int(n)) not in drop for s, n in zip(batch["source"], batch["line"], strict=True)]
    return {name: values[keep] for name, values in batch.items()}


def _worker_rows(ds: Any) -> Iterable[dict[str, Any]]:
    """The dataset's rows; a worker that cannot start (a model that does not load) is a `JobError`."""
    from ray.data.exceptions import SystemException

    try:
        yield from ds.iter_rows()
    except (ray.exceptions.RayError, SystemException) as exc:
        raise JobError(f"the Ray job failed: {_cause(exc)}") from None


def _cause(exc: BaseException) -> str:
    """The first line worth showing of the error behind a failed Ray job: a worker's `WorkerError`,
    else the last line of the innermost traceback Ray kept."""
    seen: BaseException | None = exc
    last = str(exc)
    while seen is not None:
        if isinstance(seen, WorkerError):
            return str(seen).splitlines()[0] if str(seen) else "a worker failed"
        trace = getattr(seen, "_original_stack_trace", None) or getattr(seen, "traceback_str", None)
        if trace:
            last = trace
        elif str(seen).strip():
            last = str(seen)
        seen = seen.__cause__ or seen.__context__
    lines = [line.strip() for line in last.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else type(exc).__name__
    return line.removeprefix(f"{WorkerError.__module__}.{WorkerError.__name__}: ")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def run_job(config: JobConfig, input_name: str, output_name: str, address: str | None,
            say: Callable[[str], None]) -> JobReport:
    """Run the job on Ray (connecting to `address`: None for ray.init()'s default, "local", "auto",
    HOST:PORT or ray://HOST:PORT), saying each reported line with `say`; problems with the job as asked
    are a `JobError`."""
    job = Job(config, input_name, output_name, say)
    connected = connect(address)
    try:
        return job.run()
    finally:
        if connected:
            ray.shutdown()
