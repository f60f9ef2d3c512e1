"""Load and faults, bounded in count and time: many concurrent streams (memory stable), a full wait
queue (429s), clients that leave mid-stream or while waiting (slots come back), a slow reader."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import httpx
import pytest
from serve_helpers import astream, finished, running

#: Load tests: minutes of streaming clients, run after the default suite (-m slow).
pytestmark = pytest.mark.slow

# The load: 32 concurrent streaming clients (twice the slots, so half of them queue) for 60 s.
LOAD_SECONDS = 60.0
LOAD_CLIENTS = 32


@pytest.fixture(scope="module")
def server(long_model_dir, tmp_path_factory):
    with running(long_model_dir, "--slots", "16", home=tmp_path_factory.mktemp("load")) as s:
        yield s


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=LOAD_SECONDS + 90))


def client(server, timeout: float = 60) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    return httpx.AsyncClient(base_url=server.url, timeout=timeout, limits=limits)


async def wait_idle(server, within: float) -> dict:
    """/health once every slot is free and nothing waits (fails after `within` seconds)."""
    deadline = time.monotonic() + within
    async with client(server) as c:
        while True:
            h = (await c.get("/health")).json()
            idle = h["requests_running"] == 0 and h["requests_waiting"] == 0
            if idle and h["slots_free"] == h["slots_total"]:
                return h
            assert time.monotonic() < deadline, f"slots not free within {within} s: {h}"
            await asyncio.sleep(0.02)


def test_concurrent_streams_all_complete_and_memory_is_stable(server):
    async def one_client(c: httpx.AsyncClient, k: int, end: float, out: list) -> None:
        rng = random.Random(k)
        while time.monotonic() < end:
            body = {"prompt": f"Client {k} says", "max_tokens": rng.randint(8, 48), "stream": True,
                    "seed": rng.randint(0, 1000), "stream_options": {"include_usage": True}}
            status, events, _ = await astream(c, body)
            out.append((status, events, body["max_tokens"]))

    async def sample_rss(end: float, samples: list) -> None:
        while time.monotonic() < end:
            samples.append(server.rss_kib())
            await asyncio.sleep(0.25)

    async def main() -> tuple[list, list]:
        async with client(server) as c:
            warm: list = []
            warm_end = time.monotonic() + 1.0
            await asyncio.gather(*(one_client(c, k, warm_end, warm) for k in range(LOAD_CLIENTS)))
            end = time.monotonic() + LOAD_SECONDS
            results: list = []
            samples: list = []
            await asyncio.gather(sample_rss(end, samples),
                                 *(one_client(c, k, end, results) for k in range(LOAD_CLIENTS)))
            return results, samples

    results, samples = run(main())
    assert len(results) >= LOAD_CLIENTS
    for status, events, _ in results:
        assert status == 200, events
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        assert finished(events) == {0: "length"} or finished(events) == {0: "stop"}
        assert usage["completion_tokens"] >= 1
    third = len(samples) // 3
    first, last = statistics.mean(samples[:third]), statistics.mean(samples[-third:])
    assert abs(last - first) / first < 0.10, (first, last, samples)
    assert "Traceback" not in server.log()


def test_a_full_queue_answers_429_with_retry_after(long_model_dir, tmp_path):
    with running(long_model_dir, "--queue", "8", "--slots", "2", home=tmp_path) as server:
        async def main() -> list[httpx.Response]:
            async with client(server) as c:
                body = {"prompt": "Hello", "max_tokens": 100, "ignore_eos": True}
                return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(64)))

        responses = run(main())
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}, statuses
        rejected = [r for r in responses if r.status_code == 429]
        admitted = [r for r in responses if r.status_code == 200]
        assert rejected and len(admitted) >= 2
        for r in rejected:
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "queue_full"
        for r in admitted:
            assert r.json()["choices"][0]["finish_reason"] == "length"
            assert r.json()["usage"]["completion_tokens"] == 100
        run(wait_idle(server, 1.0))


def test_clients_that_leave_free_their_slots(server):
    async def leave(c: httpx.AsyncClient, k: int) -> tuple[int, list, dict]:
        body = {"prompt": f"Leaving {k}", "max_tokens": 1000, "ignore_eos": True, "stream": True, "seed": k}
        return await astream(c, body, stop_after=1 + k % 3)

    async def main() -> None:
        async with client(server) as c:
            for wave in range(3):  # 150 clients, 50 at a time
                out = await asyncio.gather(*(leave(c, 50 * wave + k) for k in range(50)))
                assert all(status == 200 and 1 <= len(events) <= 3 for status, events, _ in out)
        await wait_idle(server, 1.0)
        # A client that leaves a non-streamed request (while it waits or runs) is cancelled too.
        async with client(server, timeout=0.3) as c:
            with pytest.raises(httpx.TimeoutException):
                await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1000, "ignore_eos": True})
        await wait_idle(server, 1.0)
        async with client(server) as c:
            r = await c.post("/v1/completions", json={"prompt": "Still there?", "max_tokens": 3})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3

    run(main())
    async def metrics() -> str:
        async with client(server) as c:
            return (await c.get("/metrics")).text

    assert "inferno_slots_busy 0.0" in run(metrics())
    assert "disconnected" in server.log()


def test_a_slow_reader_is_fine_and_others_are_unaffected(server):
    async def main() -> None:
        async with client(server) as c:
            body = {"prompt": "Slowly", "max_tokens": 8, "stream": True, "seed": 1}
            whole = (await c.post("/v1/completions", json={**body, "stream": False})).json()
            slow = asyncio.ensure_future(astream(c, body, delay=0.5))
            t0 = time.monotonic()
            fast = [{"prompt": f"Fast {k}", "max_tokens": 16, "stream": True} for k in range(8)]
            others = await asyncio.gather(*(astream(c, b) for b in fast))
            fast_seconds = time.monotonic() - t0
            assert all(status == 200 and events[-1] == "[DONE]" for status, events, _ in others)
            # Not held up by the slow reader (0.5 s per event): they are done while it still reads.
            assert not slow.done(), fast_seconds
            status, events, _ = await slow
            assert status == 200 and events[-1] == "[DONE]"
            assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole["choices"][0]["text"]

    run(main())
