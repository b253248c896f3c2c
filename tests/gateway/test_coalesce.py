"""Coalesced (gateway/coalesce.py): one call at a time, shared by the callers meanwhile."""

from __future__ import annotations

import asyncio

import pytest
from glm_operator.gateway.coalesce import Coalesced


async def test_callers_meanwhile_share_one_call_and_later_ones_call_again() -> None:
    release = asyncio.Event()
    calls = 0

    async def fetch() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return calls

    coalesced = Coalesced(fetch)
    waiting = [asyncio.create_task(coalesced()) for _ in range(10)]
    await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.gather(*waiting) == [1] * 10
    assert await coalesced() == 2 and coalesced.calls == 2


async def test_a_cancelled_caller_leaves_the_call_to_the_others() -> None:
    release = asyncio.Event()

    async def fetch() -> str:
        await release.wait()
        return "answer"

    coalesced = Coalesced(fetch)
    first, second = asyncio.create_task(coalesced()), asyncio.create_task(coalesced())
    await asyncio.sleep(0.01)
    first.cancel()  # its client left
    await asyncio.sleep(0.01)
    release.set()
    assert await second == "answer"
    assert first.cancelled()


async def test_a_failure_is_shared_then_forgotten() -> None:
    fail = True

    async def fetch() -> str:
        await asyncio.sleep(0.01)
        if fail:
            raise ConnectionError("engine down")
        return "ok"

    coalesced = Coalesced(fetch)
    results = await asyncio.gather(coalesced(), coalesced(), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results) and coalesced.calls == 1
    fail = False
    assert await coalesced() == "ok"
    with pytest.raises(ConnectionError):  # the control: not coalesced, each caller calls
        fail = True
        await coalesced()
