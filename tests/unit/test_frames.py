"""Frames read straight into their buffers (net/frames.py), on real loopback sockets under uvloop,
and the allocator setting that keeps exchange buffers from being faulted in afresh (p2p_trainer/heap.py)."""

from __future__ import annotations

import asyncio
import itertools
import os
import resource
import sys

import numpy as np
import pytest
import uvloop

from p2p_trainer.heap import keep_freed_memory
from p2p_trainer.net.frames import FrameReader


async def _serve_frames(limits: list[int], got: list[bytes | BaseException]) -> tuple[asyncio.Server, int]:
    async def serve(conn: FrameReader) -> None:
        for limit in limits:
            try:
                got.append(bytes(await conn.request(limit)))
            except (ValueError, ConnectionError, asyncio.IncompleteReadError) as exc:
                got.append(exc)
                return

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FrameReader(8, "big", serve), "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def test_frames_split_anywhere_arrive_whole_and_in_order() -> None:
    frames = [os.urandom(n) for n in (0, 1, 70_000, 300_000, 5)]
    wire = b"".join(_frame(f) for f in frames)

    async def go() -> list[bytes | BaseException]:
        got: list[bytes | BaseException] = []
        server, port = await _serve_frames([1 << 20] * len(frames), got)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        cuts = [0, 3, 9, 10, 50_000, 70_020, 200_000, len(wire)]  # inside lengths and bodies
        for a, b in itertools.pairwise(cuts):
            writer.write(wire[a:b])
            await writer.drain()
            await asyncio.sleep(0.01)
        for _ in range(100):
            if len(got) == len(frames):
                break
            await asyncio.sleep(0.02)
        writer.close()
        server.close()
        return got

    assert uvloop.run(asyncio.wait_for(go(), 20)) == frames


def test_a_frame_over_its_limit_closes_the_connection_before_its_bytes_are_read() -> None:
    async def go() -> tuple[list[bytes | BaseException], bytes]:
        got: list[bytes | BaseException] = []
        server, port = await _serve_frames([16, 1_000], got)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_frame(b"hello") + (1 << 30).to_bytes(8, "big"))  # then announces 1 GiB
        await writer.drain()
        closed = await asyncio.wait_for(reader.read(1), 5)
        writer.close()
        server.close()
        return got, closed

    got, closed = uvloop.run(asyncio.wait_for(go(), 20))
    assert got[0] == b"hello"
    assert isinstance(got[1], ValueError) and "exceeds the limit of 1000" in str(got[1])
    assert closed == b""


def test_a_connection_cut_mid_frame_is_told_apart_from_one_closed_between_frames() -> None:
    async def go(wire: bytes) -> BaseException | bytes:
        got: list[bytes | BaseException] = []
        server, port = await _serve_frames([1_000, 1_000], got)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wire)
        await writer.drain()
        writer.close()
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        server.close()
        return got[1]

    between = uvloop.run(asyncio.wait_for(go(_frame(b"one")), 20))
    assert isinstance(between, asyncio.IncompleteReadError)
    cut = uvloop.run(asyncio.wait_for(go(_frame(b"one") + _frame(b"two")[:9]), 20))
    assert isinstance(cut, ConnectionError)


def _minor_faults_of_reused_buffers(rounds: int = 30, nbytes: int = 8 << 20) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        a = np.empty(nbytes // 2, np.uint8)
        b = np.empty(nbytes // 2, np.uint8)
        a.fill(1)
        b.fill(2)
        del a, b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator: Linux only")
def test_freed_exchange_buffers_are_reused_without_page_faults() -> None:
    assert keep_freed_memory()
    _minor_faults_of_reused_buffers(rounds=2)  # the heap grows once
    pages = 30 * (8 << 20) // 4096
    # each round would fault in all its pages afresh if freed blocks went back to the system
    assert _minor_faults_of_reused_buffers() < pages // 20
