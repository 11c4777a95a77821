"""The mailbox's reader side: what a waiting `get` sees when its entry goes away under it."""

from __future__ import annotations

import asyncio

import pytest

from p2p_trainer.net.transport import Mailbox, Message


def test_a_reader_whose_entry_is_discarded_gets_nothing_instead_of_an_error() -> None:
    async def scenario() -> tuple[Message | None, float]:
        box = Mailbox()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        reader = asyncio.create_task(box.get("run/x|c|0|peer", 30.0))
        await asyncio.sleep(0.05)  # the reader is waiting on its entry
        box.discard("run/x")
        return await reader, loop.time() - t0

    got, waited = asyncio.run(scenario())
    assert got is None
    assert waited < 5.0  # it returned when the entry went, not at its timeout


def test_a_reader_whose_entry_is_evicted_gets_nothing_instead_of_an_error() -> None:
    async def scenario() -> Message | None:
        box = Mailbox(max_entries=2)
        reader = asyncio.create_task(box.get("run/old|c|0|peer", 30.0))
        await asyncio.sleep(0.05)
        for i in range(3):  # newer messages push the oldest entry, the waiting one, out
            box.put(f"run/new{i}|c|0|peer", Message("peer", {"key": f"run/new{i}"}, b"x"))
        return await reader

    assert asyncio.run(scenario()) is None


def test_cancelling_the_reader_itself_still_cancels_it() -> None:
    async def scenario() -> None:
        box = Mailbox()
        reader = asyncio.create_task(box.get("run/x|c|0|peer", 30.0))
        await asyncio.sleep(0.05)
        reader.cancel()
        await reader

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())


def test_a_message_that_arrives_while_waiting_is_returned() -> None:
    async def scenario() -> Message | None:
        box = Mailbox()
        reader = asyncio.create_task(box.get("run/x|c|0|peer", 30.0))
        await asyncio.sleep(0.05)
        box.put("run/x|c|0|peer", Message("peer", {"key": "run/x"}, b"payload"))
        return await reader

    got = asyncio.run(scenario())
    assert got is not None and got.payload == b"payload"
