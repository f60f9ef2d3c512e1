"""``inferno bench``: how fast each backend generates text on this machine.

    inferno bench                                  # every usable backend, random 124M-shape weights
    inferno bench --backends numpy,cpu-threaded --prompt-tokens 512 --new-tokens 16 --repeat 5
    inferno bench --model-dir gpt2 --json          # the real weights; one JSON object on stdout
    inferno bench -m smollm2-135m                  # a Llama-family model (in the cache or a folder)

Each backend runs the same greedy generation (random prompt ids, end-of-text ignored) `--repeat` times,
interleaved with the other backends so that a noisy neighbour slows everyone alike; the table shows
medians. Columns: prefill tok/s (the prompt through the model, up to the first new token), decode tok/s
(each later token: one cached forward step), total tok/s (new tokens over the whole generation, as
`inferno` itself reports) and each one's ratio to the ``numpy`` reference, which is always measured.

The helpers here (`random_weights`, `time_generation`, `time_prefill`, `time_decode`) are also what
``benches/`` builds on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from inferno.errors import squash
from inferno.models.config import GPT2_124M, Gpt2Config  # noqa: F401 - GPT2_124M: the shape benchmarks run
from inferno.testing import (  # noqa: F401 - where bench users found them
    RANDOM_EMBEDDING_STD,
    RANDOM_LOGIT_STD,
    random_weights,
    spread_logits,
)

BASELINE = "numpy"



class BenchError(Exception):
    """A problem with the request (flag, backend, model files); printed as one line, exit code 2."""


def counts(text: str) -> list[int]:
    """An argparse type for the benchmarks' lists of sizes: integers >= 1 separated by commas ("1,4,16")."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def prompt_ids(n: int, vocab_size: int, seed: int | Sequence[int] = 0) -> list[int]:
    """`n` random token ids (seeded: an int, or several as NumPy's SeedSequence takes them), never the
    end-of-text id (the last one)."""
    return np.random.default_rng(seed).integers(0, vocab_size - 1, size=n).tolist()


# ------------------------------------------------------------------------------------------- timing


def time_generation(model: Any, ids: Sequence[int], new_tokens: int) -> tuple[float, float | None]:
    """One greedy generation, timed like a user sees it: (seconds to the first new token, seconds per
    later token, or None when there is only one)."""
    from inferno.generate import generate_tokens

    stream = iter(generate_tokens(model, ids, new_tokens, stop_ids=()))
    start = time.perf_counter()
    next(stream)
    first = time.perf_counter()
    later = sum(1 for _ in stream)
    end = time.perf_counter()
    return first - start, ((end - first) / later if later else None)


def best_time(call: Callable[[], object], repeat: int) -> float:
    """The least of `repeat` wall-clock timings of call(), in seconds (a kernel's time without the
    machine's hiccups)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def time_prefill(model: Any, ids: Sequence[int]) -> float:
    """Seconds for the prompt through the model (fresh cache) up to host logits of its last position."""
    cache = model.new_cache(1, len(ids) + 1)
    start = time.perf_counter()
    model.backend.to_numpy(model.forward(np.asarray([ids]), cache))
    return time.perf_counter() - start


def time_decode(model: Any, ids: Sequence[int], steps: int) -> float:
    """Seconds per cached decode step (one token in, host logits out) after prefilling `ids` (untimed)."""
    cache = model.new_cache(1, len(ids) + steps)
    logits = model.backend.to_numpy(model.forward(np.asarray([ids]), cache))
    start = time.perf_counter()
    for _ in range(steps):
        token = int(np.argmax(logits[0]))
        logits = model.backend.to_numpy(model.forward(np.asarray([[token]]), cache))
    return (time.perf_counter() - start) / steps


def read_bandwidth(buffer: np.ndarray, pool: Any, threads: int, reads: int = 3) -> float:
    """Bytes per second reading `buffer`, split across `threads` of `pool` (a ThreadPoolExecutor; NumPy's
    max releases the GIL): the best of `reads` back-to-back reads, so that a neighbour's momentary burst
    does not lower the floor. (A sum would be compute bound on one core; max is not.)"""
    chunks = np.array_split(buffer, threads * 8)
    best = 0.0
    for _ in range(reads):
        start = time.perf_counter()
        list(pool.map(np.max, chunks))
        best = max(best, buffer.nbytes / (time.perf_counter() - start))
    return best

# ------------------------------------------------------------------------------------------ the run


@dataclass
class BackendResult:
    spec: str
    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    error: str | None = None
    runs_on: str = ""  # what executes its kernels here (the backend's `runs_on`, as `inferno backends` says)

    def median(self, which: str) -> float | None:
        values = self.prefill_s if which == "prefill" else self.decode_s
        return statistics.median(values) if values else None


@dataclass
class BenchRequest:
    specs: list[str]
    prompt_tokens: int = 64
    new_tokens: int = 32
    repeat: int = 3
    warmup: int = 1
    seed: int = 0
    model_dir: str | None = None
    #: Idle seconds before each timed run: BLAS/OpenMP threads of the previous backend spin for ~0.1 s.
    pause: float = 0.2


class BenchProgress:
    """One status line on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, stream: IO[str], quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write(f"\r\x1b[K{message}")
        else:
            self.stream.write(f"inferno bench: {message}\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _load_weights(model_dir: str | None, seed: int, progress: BenchProgress) -> tuple[Any, dict, str]:
    """(config, host weights by name, where they came from): a model's files (any family inferno runs:
    `inferno.models.families`), or random weights of GPT-2 124M's shape."""
    from pathlib import Path

    from inferno.models.families import read_config
    from inferno.models.names import ModelNameError, parse_model_name
    from inferno.models.resolve import ModelFilesMissing, resolve_model

    try:
        random = model_dir is not None and parse_model_name(model_dir).kind == "random"
        files = None if random else resolve_model(model_dir, download=False, progress=False)
    except ModelNameError as exc:
        raise BenchError(squash(exc)) from None
    except ModelFilesMissing as exc:
        if model_dir is not None:
            raise BenchError(squash(exc)) from None
        files = None
    if files is None:
        progress("building random 124M-shape weights" + ("" if random else " (no model files found)"))
        return GPT2_124M, random_weights(GPT2_124M, seed), "random (GPT-2 124M shape)"
    directory = Path(files.weights).parent
    progress(f"loading weights from {directory}")
    family, config = read_config(files.config)
    weights = dict(family.load().iter_weights(files.weights, config, None))
    return config, weights, str(directory)


def weights_in_layout(
    weights: dict[str, np.ndarray], backend: Any, cache: dict[tuple[str, ...], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """`weights` in the memory order `backend.weight_order` asks for, converted once per distinct layout
    (in `cache`, which belongs to this one `weights` dict), so that backends wanting the same layout
    (numpy, cpu-threaded) share one copy."""
    key = tuple(backend.weight_order(name) for name in weights)
    if key not in cache:
        cache[key] = {name: np.asarray(a, order=o) for (name, a), o in zip(weights.items(), key, strict=True)}
    return cache[key]


def run_bench(request: BenchRequest, progress: BenchProgress | None = None) -> dict[str, Any]:
    """Measure every backend of `request`; returns the report (what ``--json`` prints)."""
    from inferno.backends.registry import get_backend

    progress = progress or BenchProgress(sys.stderr, quiet=True)
    backends: dict[str, Any] = {}
    try:
        for spec in request.specs:
            try:
                backends[spec] = get_backend(spec)
            except (ValueError, RuntimeError) as exc:  # the registry's errors name the backend and option
                raise BenchError(squash(exc)) from None
        return _run(request, backends, progress)
    finally:
        for backend in backends.values():
            backend.close()
        progress.done()


def _run(request: BenchRequest, backends: dict[str, Any], progress: BenchProgress) -> dict[str, Any]:
    from inferno.models.families import from_weights

    config, weights, source = _load_weights(request.model_dir, request.seed, progress)
    total = request.prompt_tokens + request.new_tokens
    if total > config.n_positions:
        raise BenchError(f"--prompt-tokens + --new-tokens = {total} exceeds the model's context "
                         f"({config.n_positions})")
    ids = prompt_ids(request.prompt_tokens, config.vocab_size, request.seed)
    warm_ids = ids[: min(8, len(ids))]

    results = [BackendResult(spec, runs_on=_runs_on(backends[spec])) for spec in request.specs]
    models: dict[str, Any] = {}
    layouts: dict[tuple[str, ...], dict[str, np.ndarray]] = {}
    for r in results:
        progress(f"loading {r.spec}")
        try:
            laid_out = weights_in_layout(weights, backends[r.spec], layouts)
            models[r.spec] = from_weights(config, laid_out, backends[r.spec])
            for _ in range(request.warmup):
                time_generation(models[r.spec], warm_ids, 2)
        except Exception as exc:  # noqa: BLE001 - one broken backend must not sink the others
            r.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    for rep in range(request.repeat):
        for r in results:
            if r.error is not None:
                continue
            progress(f"round {rep + 1}/{request.repeat}: {r.spec} (prompt {request.prompt_tokens}, "
                     f"{request.new_tokens} new tokens)")
            time.sleep(request.pause)
            try:
                prefill, decode = time_generation(models[r.spec], ids, request.new_tokens)
            except Exception as exc:  # noqa: BLE001
                r.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                continue
            r.prefill_s.append(prefill)
            if decode is not None:
                r.decode_s.append(decode)
    return _report(request, config, source, results)


def _runs_on(backend: Any) -> str:
    try:
        return str(type(backend).runs_on())
    except Exception:  # noqa: BLE001 - a plugin's description must not sink the measurement
        return ""


def _report(request: BenchRequest, config: Any, source: str, results: list[BackendResult]) -> dict:
    from inferno.cpu import usable_cores
    from inferno.models.families import family_of

    family = family_of(config.to_dict())

    n_new, n_prompt = request.new_tokens, request.prompt_tokens
    rows = []
    for r in results:
        prefill, decode = r.median("prefill"), r.median("decode")
        row: dict[str, Any] = {"backend": r.spec, "status": "ok" if r.error is None else "failed",
                               "runs_on": r.runs_on}
        if r.error is not None:
            row["error"] = r.error
        if prefill is not None:
            seconds = prefill + (decode or 0.0) * (n_new - 1)
            row.update({
                "prefill_seconds": prefill,
                "prefill_tokens_per_second": n_prompt / prefill,
                "decode_seconds_per_token": decode,
                "decode_tokens_per_second": 1.0 / decode if decode else None,
                "total_tokens_per_second": n_new / seconds,
                "samples": len(r.prefill_s),
            })
        rows.append(row)
    base = next((row for row in rows if row["backend"] == BASELINE and "prefill_seconds" in row), None)
    for row in rows:
        if base is not None and "prefill_seconds" in row:
            row["vs_numpy"] = {
                key: (row[f"{key}_tokens_per_second"] / base[f"{key}_tokens_per_second"]
                      if row[f"{key}_tokens_per_second"] and base[f"{key}_tokens_per_second"] else None)
                for key in ("prefill", "decode", "total")
            }
    return {
        "weights": source,
        "family": family.name,
        "family_label": family.label,
        "model_type": config.to_dict().get("model_type", "gpt2"),
        "model": {k: getattr(config, k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "vocab_size")},
        "prompt_tokens": n_prompt,
        "new_tokens": n_new,
        "repeat": request.repeat,
        "pause_seconds": request.pause,
        "statistic": "median",
        "machine": {"usable_cores": usable_cores(), "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version(),
                    "numpy": np.__version__},
        "results": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as the text table the command prints."""
    label = report.get("family_label", "GPT-2")
    if report.get("model_type", "gpt2") != report.get("family", "gpt2"):
        label += f" family, {report['model_type']}"
    lines = [
        f"{label} ({report['weights']}): prompt {report['prompt_tokens']} tokens, {report['new_tokens']} new "
        f"tokens, greedy; median of {report['repeat']}; {report['machine']['usable_cores']} usable cores",
        "",
    ]
    header = ("backend", "prefill tok/s", "decode tok/s", "total tok/s", "vs numpy: prefill", "decode",
              "total")
    table = [header]
    for row in report["results"]:
        if "prefill_seconds" not in row:
            table.append((row["backend"], "failed", "", "", "", "", ""))
            continue
        ratios = row.get("vs_numpy", {})
        table.append((
            row["backend"],
            _num(row["prefill_tokens_per_second"]),
            _num(row["decode_tokens_per_second"]),
            _num(row["total_tokens_per_second"]),
            *(f"{ratios[k]:.2f}x" if ratios.get(k) else "-" for k in ("prefill", "decode", "total")),
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, len(header))]
        lines.append("  ".join(cells).rstrip())
    paths = [f"  {row['backend']}: {row['runs_on']}" for row in report["results"] if row.get("runs_on")]
    if paths:
        lines += ["", "runs on:", *paths]
    for row in report["results"]:
        if row.get("error"):
            lines.append(f"{row['backend']} failed: {row['error']}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def split_specs(text: str) -> list[str]:
    """``"numpy,cpu-threaded:threads=2,min_rows=8"`` → ``["numpy", "cpu-threaded:threads=2,min_rows=8"]``:
    a piece with ``=`` but no ``:`` is another option of the spec before it."""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if specs and "=" in piece and ":" not in piece:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def choose_backends(text: str | None) -> tuple[list[str], list[str]]:
    """(specs to measure, notes about usable-looking backends that were skipped)."""
    from inferno.backends.registry import get_backend_class, list_backends, parse_backend_spec

    if text is None:
        infos = list_backends()
        specs = [i.name for i in infos if i.ok]
        notes = [f"skipped {i.name}: {i.status}" for i in infos if not i.ok]
    else:
        specs, notes = split_specs(text), []
        if not specs:
            raise BenchError("--backends names no backend")
        for spec in specs:
            try:
                get_backend_class(parse_backend_spec(spec)[0])
            except (ValueError, RuntimeError) as exc:
                raise BenchError(squash(exc)) from None
    if BASELINE not in specs:
        specs.insert(0, BASELINE)
    return list(dict.fromkeys(specs)), notes
