"""The ``cpu-threaded`` backend: GPT-2 on every usable core, with NumPy.

    inferno --backend cpu-threaded "The quick brown fox"
    inferno --backend cpu-threaded:threads=4 "..."           # or INFERNO_THREADS=4

**What it does.** A prompt of at least `MIN_ROWS` tokens runs on a persistent pool of ``threads``
workers (the calling thread is one of them), with BLAS single-threaded inside it:

* every large matmul (c_attn, c_proj, c_fc, the MLP's c_proj, an all-positions LM head) in 2-D blocks:
  row tiles of up to `ROW_TILE` tokens times blocks of weight columns, about `TASKS_PER_THREAD` blocks
  per thread, claimed dynamically (a thread the OS deschedules holds up one block, not half the op).
  The bias, and gelu for c_fc, are applied to each block while it is in cache;
* the MLP, once there are `FUSED_MLP_ROWS` tokens per thread, by row tiles instead: each task takes
  its rows through c_fc, gelu and c_proj in one go (one barrier instead of two, and the hidden block
  still in cache for c_proj);
* causal attention by (head group, query tile): a tile of `QUERY_TILE` queries reads only the keys up
  to its last query, so the masked half of the T×T scores is never computed, and only the tile's own
  diagonal block is masked; the softmax's division is applied to the [tile, D] output, not the
  [tile, T] probabilities; heads write straight into their columns of the merged [B, T, C] layout;
* layernorm, softmax, gelu over row chunks when they are large (numpy runs them on one core).

Decode (one token) and short prompts run *directly*: the numpy reference's own calls (GEMV for one
row), with OpenBLAS's threads.

**Why** (the measurements behind each choice are in docs/benchmarks.md, "cpu-threaded"):

* *Threads, not processes.* NumPy releases the GIL in BLAS and ufuncs, so the pool's threads run the
  prefill matmuls and attention in parallel; processes would also need every activation and the KV
  cache in shared memory.
* *Decode stays on OpenBLAS's threads.* A GEMV is short, and a pooled call pays wake-ups and GIL
  hand-offs that outweigh it.
* *Short prompts stay direct.* The pool pays only from `MIN_ROWS` tokens on; small row tiles cost
  single-threaded BLAS efficiency (hence `ROW_TILE`).
* *No pre-split weights.* Blocks are views of the weights as loaded (in the numpy backend's layout):
  strided column blocks run as fast as contiguous copies, and copies would double the weights' memory.
* *BLAS pinned to one thread around pooled work*, and during every other matmul of a long prompt too:
  OpenBLAS's own workers spin for a while after a call and would compete with the pool for the same
  cores. The limit is `inferno.cpu.blas_threads`, process-wide and locked, and restored after each
  call, so other NumPy code in the process keeps its BLAS threads, and backends used from several
  threads at once each restore exactly what they found.

**Worker count.** `inferno.cpu.resolve_threads`: the ``threads`` option, else ``$INFERNO_THREADS``, else
the usable cores (the CPU affinity capped by the cgroup CPU quota), at most `MAX_THREADS`.
``threads=1`` runs everything on the calling thread with one BLAS thread (the tiled attention still
skips masked blocks).

**Lifecycle.** Helpers are daemon threads (a forgotten backend never keeps the interpreter alive);
`close()` (also a context manager, and a `weakref.finalize` run when the backend is garbage collected
or at interpreter exit) stops and joins them. An exception in any task is re-raised in the caller and
the pool stays usable; after Ctrl-C in the caller the helpers drop the rest of that call. A helper
that dies (only a bug or an injected exception can end one) turns the next pooled call into a
`WorkerError` naming it, never a hang: the caller polls the helpers' liveness while it waits. A
forked child starts its own helpers on first use. A backend may be used from several threads at once
(their calls share the pool).

**On many cores** the pool grows to the usable cores and the blocking adapts: matmuls split by weight
columns first and by rows once columns run out (at least `MIN_COLS` columns and `MIN_TILE_ROWS` rows
per block), attention into more head groups per query tile, so every op keeps about `TASKS_PER_THREAD`
tasks per thread, each large enough to outweigh its dispatch. The thresholds were chosen on a small
machine: ``python benches/compare.py --scaling`` re-measures them on another. Beyond one NUMA node
the weights live where they were loaded; interleaving them is future work.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import warnings
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from inferno.backends.hookspecs import hookimpl
from inferno.backends.numpy_backend import NumpyBackend, gelu_new_into, layernorm_into, softmax_into
from inferno.cpu import blas_threads, current_blas_threads, resolve_threads

# Below these sizes the pool costs more (waking threads, smaller BLAS calls) than it gains, and a kernel
# runs directly, as in the numpy backend (chosen by measurement: docs/benchmarks.md).
MIN_ROWS = 192  # tokens: fewer (decode, short prompts) run directly, with BLAS's own threads
MIN_MACS = 1 << 24  # matmul multiply-adds (below this, dispatch outweighs the work)
MIN_ELEMENTS = 1 << 19  # elementwise kernels, attention scores (layernorm pays only on long prompts)
ROW_TILE = 512  # matmul rows per task at most (single-threaded BLAS loses efficiency on smaller tiles)
MIN_COLS = 64  # matmul weight columns per task at least
MIN_TILE_ROWS = 64  # and rows
TASKS_PER_THREAD = 2  # more tasks than threads, so that one descheduled thread does not hold up the rest
QUERY_TILE = 64  # attention: queries per task; the causal mask wastes only QUERY_TILE²/2 scores per tile
FUSED_MLP_ROWS = 256  # rows per thread from which a whole MLP runs by row tiles (see `mlp`)


# -------------------------------------------------------------------------------------------- pool


class WorkerError(RuntimeError):
    """A worker thread of the pool died, or the pool was used after `close()`."""


class _Batch:
    """One parallel call: tasks 0..n-1, claimed one at a time by whichever thread is free.

    The caller waits for the helpers without holding a lock: Ctrl-C can interrupt it between any two
    bytecodes, and a lock taken in Python code (a `threading.Condition`) can then stay held for good,
    every helper blocked on it. So every helper the call is handed to reports once on `done`, a C
    queue whose `get` Ctrl-C interrupts with nothing held, and the caller waits for all of them (one
    that comes late finds no task left and reports at once)."""

    __slots__ = ("fn", "n", "claim", "cancelled", "errors", "done")

    def __init__(self, fn: Callable[[int], None], n: int) -> None:
        self.fn = fn
        self.n = n
        self.claim = itertools.count().__next__  # atomic under the GIL
        self.cancelled = False
        self.errors: list[BaseException] = []  # the first is re-raised in the caller
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # one item per helper that left work()

    def work(self) -> None:
        """Run tasks until none are left (in a helper thread); record the first exception."""
        try:
            while not self.cancelled:
                i = self.claim()
                if i >= self.n:
                    break
                try:
                    self.fn(i)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, which re-raises it
                    self.cancelled = True
                    self.errors.append(exc)
        finally:
            self.done.put(None)


class WorkerPool:
    """A persistent pool of ``threads - 1`` helper threads; the calling thread is the last worker.

    `run(fn, n)` calls ``fn(0) .. fn(n - 1)`` on all threads and returns when every task is done,
    re-raising the first exception a task raised. Helpers are daemon threads (a forgotten pool can
    never keep the interpreter alive), stopped and joined by `close()`, which also runs when the owner
    is garbage collected or at interpreter exit (see `ThreadedBackend`).
    """

    def __init__(self, threads: int, name: str = "inferno-cpu-threaded") -> None:
        self.threads = threads
        self.name = name
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(self.threads - 1)]
        self._helpers = [
            threading.Thread(target=_helper_loop, args=(q,), name=f"{self.name}-{i + 1}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for t in self._helpers:
            t.start()

    def run(self, fn: Callable[[int], None], n: int) -> None:
        if self._closed:
            raise WorkerError("the cpu-threaded backend was closed; create a new one to keep computing")
        if os.getpid() != self._pid:
            self._start()  # a forked child inherits the pool object but none of its threads
        if n <= 1 or not self._helpers:
            for i in range(n):
                fn(i)
            return
        self._check_helpers()
        batch = _Batch(fn, n)
        handed = self._queues[: n - 1]
        try:
            for q in handed:
                q.put(batch)
            while not batch.cancelled:
                i = batch.claim()
                if i >= n:
                    break
                fn(i)
            self._wait(batch, len(handed))
        except BaseException:
            # Our own task failed, or Ctrl-C: helpers stop after their current task (they only ever write
            # to this call's buffers, which nobody reads any more).
            batch.cancelled = True
            raise
        if batch.errors:
            raise batch.errors[0]

    def _wait(self, batch: _Batch, helpers: int) -> None:
        """Until each of the `helpers` handed `batch` has left it (counting only those that began it
        would not do: a late one's report could be taken for that of one still in a task)."""
        for _ in range(helpers):
            while True:
                try:
                    batch.done.get(timeout=0.5)
                    break
                except queue.Empty:
                    # Helpers only die by a bug or an injected exception; never wait forever on one.
                    self._check_helpers()

    def _check_helpers(self) -> None:
        dead = [t.name for t in self._helpers if not t.is_alive()]
        if dead:
            raise WorkerError(f"cpu-threaded: worker thread {', '.join(dead)} died; "
                              "close this backend and create a new one")

    def close(self, timeout: float = 10.0) -> None:
        """Stop and join the helpers (each finishes its current task first). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return
        for q in self._queues:
            q.put(None)
        me = threading.current_thread()
        for t in self._helpers:
            if t is not me:
                t.join(timeout)
        if stuck := [t.name for t in self._helpers if t is not me and t.is_alive()]:
            # A bug, never a wait: say so rather than leave a process that took `timeout` s to stop.
            warnings.warn(f"cpu-threaded: worker thread {', '.join(stuck)} did not stop within {timeout:g} s",
                          RuntimeWarning, stacklevel=2)

    @property
    def closed(self) -> bool:
        return self._closed


def _helper_loop(q: queue.SimpleQueue) -> None:
    while (batch := q.get()) is not None:
        batch.work()
        del batch  # do not keep the finished call's buffers alive while idle


# ----------------------------------------------------------------------------------------- backend


class ThreadedBackend(NumpyBackend):
    name = "cpu-threaded"
    description = ("NumPy on all cores: blocked matmuls and causal tiled attention on a thread pool for "
                   "long prompts (threads=N; default $INFERNO_THREADS or the usable cores).")

    @classmethod
    def runs_on(cls) -> str:
        return "NumPy + BLAS, a thread pool"

    def __init__(
        self,
        threads: int | str | None = None,
        dtype: str | np.dtype = "float32",
        *,
        min_rows: int = MIN_ROWS,
        min_macs: int = MIN_MACS,
        min_elements: int = MIN_ELEMENTS,
        fused_mlp_rows: int = FUSED_MLP_ROWS,
    ) -> None:
        """`threads`: worker count (see `resolve_threads`). Below `min_rows` rows (tokens) or `min_macs`
        multiply-adds a matmul runs directly, below `min_elements` elements an elementwise kernel or the
        attention scores do; 1, 1, 1 force the pool everywhere (for tests). From `fused_mlp_rows` rows
        per thread an MLP runs as row tiles through both of its matmuls."""
        super().__init__(dtype)
        self.threads = resolve_threads(threads)
        self.min_rows = int(min_rows)
        self.min_macs = int(min_macs)
        self.min_elements = int(min_elements)
        self.fused_mlp_rows = int(fused_mlp_rows)
        if self.fused_mlp_rows < 1:
            raise ValueError(f"cpu-threaded: fused_mlp_rows must be a positive integer, got "
                             f"{fused_mlp_rows!r}")
        self._direct_limit = self.threads if self.threads < current_blas_threads() else None
        self._pool = WorkerPool(self.threads)
        # Runs close() when the backend is garbage collected or at interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, self._pool.close)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import threadpoolctl  # noqa: F401
        except ImportError:
            return "needs threadpoolctl (pip install threadpoolctl) to keep BLAS from oversubscribing cores"
        return None

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> ThreadedBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ThreadedBackend 'cpu-threaded' threads={self.threads}>"

    # ------------------------------------------------------------------------------------- plumbing

    def _one_blas_thread(self) -> AbstractContextManager:
        """BLAS single-threaded while the pool runs: the pool is the parallelism, and BLAS's own threads
        would oversubscribe the cores. Restored on exit, so other code in the process is unaffected."""
        return blas_threads(1)

    def _blas_for(self, rows: int) -> AbstractContextManager:
        """BLAS threads for a matmul that runs directly. In a prefill (many rows) one thread too: BLAS's
        threads would compete with the pool's for the same cores between pooled kernels. In decode (few
        rows) BLAS's own threads, as in the numpy backend, but no more than we were given."""
        if rows >= self.min_rows:
            return self._one_blas_thread()
        if self._direct_limit is not None:
            return blas_threads(self._direct_limit)
        return nullcontext()

    def _row_tiles(self, rows: int) -> list[slice]:
        """TASKS_PER_THREAD row slices per thread (elementwise kernels)."""
        return _chunks(rows, self.threads * TASKS_PER_THREAD)

    def _pooled_gemm(self, rows: int, k: int, n: int) -> bool:
        return self.threads > 1 and rows >= self.min_rows and rows * k * n >= self.min_macs

    def _gemm(self, x2, w, b, out, post: Callable[[np.ndarray], None] | None = None) -> None:
        """``out = post(x2 @ w + b)`` with x2 [M, K], w [K, N], out [M, N].

        Large products run on the pool in blocks: tiles of at most ROW_TILE rows times blocks of weight
        columns (views, no copy), enough blocks for TASKS_PER_THREAD per thread; bias and `post` (gelu)
        are applied to each block while it is in cache. Small ones (decode) run directly, BLAS threaded
        as in the numpy backend.
        """
        rows, n_out = out.shape
        if not self._pooled_gemm(rows, x2.shape[1], n_out):
            with self._blas_for(rows):
                if rows == 1:  # GEMV: GEMM would pack the whole weight for one row (as the numpy backend)
                    np.matmul(x2[0], w, out=out[0])
                else:
                    np.matmul(x2, w, out=out)
            if b is not None:
                out += b
            if post is not None:
                post(out)
            return
        # About TASKS_PER_THREAD blocks per thread: whole rows (up to ROW_TILE) split by columns first;
        # rows are split further (down to MIN_TILE_ROWS) only when the columns run out (many cores).
        tasks = self.threads * TASKS_PER_THREAD
        max_cols = max(1, n_out // MIN_COLS)
        n_rows = max(math.ceil(rows / ROW_TILE), math.ceil(tasks / max_cols))
        row_parts = _chunks(rows, max(1, min(n_rows, rows // MIN_TILE_ROWS)))
        col_parts = _chunks(n_out, min(max_cols, math.ceil(tasks / len(row_parts))))
        blocks = [(r, c) for r in row_parts for c in col_parts]

        def task(i: int) -> None:
            r, c = blocks[i]
            o = out[r, c]
            np.matmul(x2[r], w[:, c], out=o)
            if b is not None:
                o += b[c]
            if post is not None:
                post(o)

        with self._one_blas_thread():
            self._pool.run(task, len(blocks))

    # -------------------------------------------------------------------------------------- kernels

    def _numpy_path(self, x) -> bool:
        """Decode and short prompts with BLAS's own threads: exactly the numpy reference's calls."""
        return x.size < self.min_rows * x.shape[-1] and self._direct_limit is None

    def linear(self, x, w, b):
        if self._numpy_path(x):
            return super().linear(x, w, b)
        x2 = x.reshape(-1, x.shape[-1])
        out = np.empty((x2.shape[0], w.shape[1]), dtype=np.result_type(x, w))
        self._gemm(x2, w, b, out)
        return out.reshape(*x.shape[:-1], w.shape[1])

    def lm_head(self, x, wte):
        if self._numpy_path(x):
            return super().lm_head(x, wte)
        x2 = x.reshape(-1, x.shape[-1])
        out = np.empty((x2.shape[0], wte.shape[0]), dtype=np.result_type(x, wte))
        self._gemm(x2, wte.T, None, out)  # column blocks of wte.T are views: no copy of the 150 MB
        return out.reshape(*x.shape[:-1], wte.shape[0])

    def mlp(self, x, w_fc, b_fc, w_proj, b_proj):
        if self._numpy_path(x):
            return super().mlp(x, w_fc, b_fc, w_proj, b_proj)
        x2 = x.reshape(-1, x.shape[-1])
        rows, dtype = x2.shape[0], np.result_type(x, w_fc)
        out = np.empty((rows, w_proj.shape[1]), dtype=dtype)
        per_thread = rows // (self.threads * self.fused_mlp_rows)
        if self.threads > 1 and per_thread >= 1:
            # Long prompts: a task takes whole rows through c_fc, gelu and c_proj, so its hidden block
            # is still in cache for c_proj and the MLP has one barrier instead of two. Shorter: too few
            # rows per task for BLAS.
            # One or TASKS_PER_THREAD tiles per thread: more would be shorter than fused_mlp_rows. At
            # most ROW_TILE rows each (many rows on few threads), so a hidden block stays ~6 MB.
            tiles = _chunks(rows, max(self.threads * min(per_thread, TASKS_PER_THREAD),
                                      math.ceil(rows / ROW_TILE)))

            def task(i: int) -> None:
                r = tiles[i]
                h = x2[r] @ w_fc
                h += b_fc
                _gelu_inplace(h)
                o = out[r]
                np.matmul(h, w_proj, out=o)
                o += b_proj

            with self._one_blas_thread():
                self._pool.run(task, len(tiles))
        else:
            h = np.empty((rows, w_fc.shape[1]), dtype=dtype)
            self._gemm(x2, w_fc, b_fc, h, post=_gelu_inplace)  # bias and gelu inside each c_fc block
            self._gemm(h, w_proj, b_proj, out)
        return out.reshape(*x.shape[:-1], w_proj.shape[1])

    def self_attention(self, x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head):
        if self._numpy_path(x):  # with this backend's attention kernel
            return super().self_attention(x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head)
        bsz, t, c = x.shape
        dtype = np.result_type(x, w_attn)
        qkv = np.empty((bsz, t, w_attn.shape[1]), dtype=dtype)
        self._gemm(x.reshape(-1, c), w_attn, b_attn, qkv.reshape(bsz * t, -1))
        q, k, v = self.split_heads(qkv, n_head)
        k_cache, v_cache = self.write_kv(kv[0], kv[1], k, v, offset)
        y = np.empty((bsz, t, c), dtype=dtype)
        # Heads write straight into their columns of the merged [B, T, C] layout: no merge_heads copy.
        self._attend(q, k_cache, v_cache, offset, y.reshape(bsz, t, n_head, -1).transpose(0, 2, 1, 3))
        out = np.empty((bsz, t, w_proj.shape[1]), dtype=dtype)
        self._gemm(y.reshape(bsz * t, c), w_proj, b_proj, out.reshape(bsz * t, -1))
        return out, (k_cache, v_cache)

    def attention(self, q, k_cache, v_cache, offset):
        out = np.empty(q.shape, dtype=q.dtype)
        self._attend(q, k_cache, v_cache, offset, out)
        return out

    def _attend(self, q, k_cache, v_cache, offset, out) -> None:
        """Causal attention into `out` ([B, H, T, D], any strides), by (batch, head group, query tile).

        A tile of queries i0..i1 sees keys 0 .. offset + i1 - 1 only: the masked keys after that are never
        computed, and only the tile's own diagonal block needs the mask. Serial (all heads per task) when
        small, as in decode.
        """
        bsz, n_head, t, d = q.shape
        if t == 1 and self._direct_limit is None:  # decode: one query per head, nothing to mask or tile
            s = q @ k_cache[:, :, : offset + 1].swapaxes(-1, -2)
            s *= 1.0 / math.sqrt(d)
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            np.matmul(s, v_cache[:, :, : offset + 1], out=out)
            out /= s.sum(axis=-1, keepdims=True)
            return
        mask = _causal_mask(min(t, QUERY_TILE), q.dtype) if t > 1 else None
        tiles = [(i, min(i + QUERY_TILE, t)) for i in range(0, t, QUERY_TILE)]
        pooled = (self.threads > 1 and bsz * t >= self.min_rows
                  and bsz * n_head * t * (offset + t) >= self.min_elements)
        if not pooled:  # decode and short prompts: every head at once, tile by tile
            with self._blas_for(bsz * t):
                for b in range(bsz):
                    for i0, i1 in tiles:
                        _attend_tile(q[b], k_cache[b], v_cache[b], offset, i0, i1, mask, out[b])
            return
        tiles.reverse()  # the longest rows first: better balance at the end
        per_tile = math.ceil(self.threads * TASKS_PER_THREAD / (len(tiles) * bsz))
        group = math.ceil(n_head / min(per_tile, n_head))
        heads = [(h, min(h + group, n_head)) for h in range(0, n_head, group)]
        tasks = [(b, h, r) for r in tiles for b in range(bsz) for h in heads]

        def task(i: int) -> None:
            b, (h0, h1), (i0, i1) = tasks[i]
            _attend_tile(q[b, h0:h1], k_cache[b, h0:h1], v_cache[b, h0:h1], offset, i0, i1, mask,
                         out[b, h0:h1])

        with self._one_blas_thread():
            self._pool.run(task, len(tasks))

    def gelu_new(self, x):
        if self.threads == 1 or x.size < self.min_elements:
            return super().gelu_new(x)
        out = np.array(x, copy=True)
        flat = out.reshape(-1)
        chunks = _chunks(flat.size, self.threads * TASKS_PER_THREAD)
        self._pool.run(lambda i: _gelu_inplace(flat[chunks[i]]), len(chunks))
        return out

    def layernorm(self, x, gamma, beta, eps):
        if self.threads == 1 or x.size < self.min_elements:
            return super().layernorm(x, gamma, beta, eps)
        return self._by_rows(x, lambda rows, out: layernorm_into(rows, gamma, beta, eps, out))

    def softmax(self, x):
        if self.threads == 1 or x.size < self.min_elements or x.size == x.shape[-1]:
            return super().softmax(x)  # small, or a single row
        return self._by_rows(x, softmax_into)

    def _by_rows(self, x, kernel: Callable[[np.ndarray, np.ndarray], object]) -> np.ndarray:
        """Run the reference's row-wise `kernel(rows, out_rows)` on row tiles of `x`, on the pool."""
        x2 = x.reshape(-1, x.shape[-1])
        out = np.empty_like(x2)
        tiles = self._row_tiles(x2.shape[0])
        self._pool.run(lambda i: kernel(x2[tiles[i]], out[tiles[i]]), len(tiles))
        return out.reshape(x.shape)

    def add(self, a, b):
        if self.threads == 1 or a.size < 4 * self.min_elements:
            return a + b
        out = np.empty(a.shape, dtype=np.result_type(a, b))
        fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
        chunks = _chunks(fo.size, self.threads)
        self._pool.run(lambda i: np.add(fa[chunks[i]], fb[chunks[i]], out=fo[chunks[i]]), len(chunks))
        return out

    # ---------------------------------------------------------------------- the Llama family's kernels
    # The others are the numpy backend's (inherited); its gqa_attention with as many key/value heads as
    # query heads is `attention`, this backend's pooled one.

    def gqa_attention(self, q, k_cache, v_cache, offset):
        """Long prompts under grouped-query attention: each member of the query-head groups (heads j,
        j + r, ..., one per key/value head) through the pooled, tiled attention, written straight into
        its heads of the output. Decode and short prompts as the numpy backend (one batched product)."""
        b, n_head, t, _ = q.shape
        r = n_head // k_cache.shape[1]
        if r == 1 or self.threads == 1 or b * t < self.min_rows:
            return super().gqa_attention(q, k_cache, v_cache, offset)
        out = np.empty(q.shape, dtype=q.dtype)
        for j in range(r):
            self._attend(q[:, j::r], k_cache, v_cache, offset, out[:, j::r])
        return out


def _attend_tile(q, k_cache, v_cache, offset: int, i0: int, i1: int, mask, out) -> None:
    """Queries i0..i1 of q ([heads, T, D], at positions offset + i) over their keys, into out[:, i0:i1].

    Only keys 0 .. offset + i1 - 1 are read: the causally masked ones after them are never computed,
    and `mask` (-inf above the diagonal) is added to the tile's own diagonal block only.
    """
    s_len = offset + i1
    qs = q[:, i0:i1] * (1.0 / math.sqrt(q.shape[-1]))  # scale the [tq, D] queries, not the [tq, S] scores
    s = qs @ k_cache[:, :s_len].transpose(0, 2, 1)  # [heads, tq, S]
    if mask is not None and i1 - i0 > 1:
        tq = i1 - i0
        s[:, :, s_len - tq :] += mask[:tq, :tq]
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    o = out[:, i0:i1]
    np.matmul(s, v_cache[:, :s_len], out=o)
    o /= total  # normalise the [tq, D] output rather than the [tq, S] probabilities


def _gelu_inplace(x: np.ndarray) -> None:
    gelu_new_into(x, x)


def _chunks(size: int, n: int) -> list[slice]:
    """At most `n` consecutive non-empty slices covering range(size), 16-element aligned when large."""
    step = max(1, math.ceil(size / max(1, n)))
    if size >= 16 * n:
        step = math.ceil(step / 16) * 16  # whole 64-byte lines of float32 per slice
    return [slice(i, min(i + step, size)) for i in range(0, size, step)]


_masks: dict[tuple[int, str], np.ndarray] = {}


def _causal_mask(n: int, dtype: np.dtype) -> np.ndarray:
    """[n, n] additive mask: -inf above the diagonal (a key after the query), 0 elsewhere."""
    key = (n, np.dtype(dtype).str)
    if key not in _masks:
        _masks[key] = np.triu(np.full((n, n), -np.inf, dtype=dtype), k=1)
    return _masks[key]


@hookimpl
def register_backends(register) -> None:
    register(ThreadedBackend)
