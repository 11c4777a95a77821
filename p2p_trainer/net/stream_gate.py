"""Incoming libp2p streams taken a few at a time, so no sender can make this process hold descriptors.

p2pd hands each incoming stream to the process that registered its protocol as a new Unix-socket
connection, prefixed with a StreamInfo naming the (libp2p-authenticated) sender. hivemind's stream
server accepts those connections as fast as they come, in bursts of up to its backlog, and every
one is a descriptor in this process before any handler can look at its sender: an attacker that
reopens hundreds of streams the moment they are closed keeps hundreds open here
(docs/security-results.md).

The gate listens on a socket of its own and accepts only while fewer than `max_pending`
connections wait to have their sender read; it then closes, at once, a connection from a sender
that already has its protocol's bound of streams open, and any connection past `max_open` handed
to handlers (many identities, each within its bound) unless its sender is `favoured`.
Connections p2pd makes meanwhile wait in the kernel's queue: p2pd's descriptors and kernel
memory, not ours. So this process holds at most `max_pending + max_open` plus the favoured
senders' bounds, and one sender at most `max_pending` plus its bounds. Whoever connects to the
socket can claim any sender, so it is this user's alone (mode 0600, set before it listens). It speaks p2pd's public control protocol through hivemind's bindings;
hivemind's own handlers (the DHT's) are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable

from google.protobuf.message import DecodeError
from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.control import DaemonConnector
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import raise_if_failed, read_pbmsg_safe, write_pbmsg
from hivemind.proto import p2pd_pb2
from hivemind.utils.multiaddr import Multiaddr

from p2p_trainer.processes import GATE_SOCKET_PREFIX, SOCKET_DIR

logger = logging.getLogger(__name__)

Handler = Callable[[StreamInfo, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

MAX_PENDING = 16
"""Accepted connections whose StreamInfo is not read yet; p2pd writes it as it connects."""
MAX_OPEN = 256
"""Connections handed to handlers at once, all senders and protocols together."""
INFO_TIMEOUT_S = 10.0
"""A connection still without its StreamInfo after this long is closed."""
CLOSE_WAIT_S = 1.0
"""Longest wait for a refused connection's socket to be closed before its slot is taken again."""
CONTROL_TIMEOUT_S = 5.0
"""A (un)registration p2pd has not answered by then failed (a daemon that hangs or is gone)."""


class StreamGate:
    """One listening socket for this process's stream protocols, with bounded accepts (above)."""

    @classmethod
    def unbounded(cls, p2p: P2P) -> StreamGate:
        """A gate that takes every stream as it comes and hands it on (`[security] defences =
        false`): what a receiver without these bounds holds, so the attack on it can be measured."""
        return cls(p2p, max_pending=None, max_open=None)

    def __init__(
        self, p2p: P2P, max_pending: int | None = MAX_PENDING, max_open: int | None = MAX_OPEN
    ) -> None:
        """None: no bound (`unbounded`)."""
        self._daemon = DaemonConnector(p2p.daemon_listen_maddr)
        self._pending = asyncio.Semaphore(max_pending) if max_pending is not None else None
        self.max_open = max_open
        self._handlers: dict[str, tuple[Handler, int | None]] = {}
        self._open: dict[tuple[str, str], int] = {}
        """(sender, protocol) -> connections handed to a handler and not yet finished."""
        self._handed = 0
        self.favoured: Callable[[str], bool] = lambda _: False
        """Senders `max_open` never refuses (the live view's members): many identities filling it
        cannot shut out the peers this one exchanges with."""
        self._held = 0
        self.peak_open = 0
        """The most connections this gate held at once (waiting for their StreamInfo or handed over)."""
        self.refused = 0
        """Connections closed before a handler ran (over a bound, no StreamInfo, no handler)."""
        self.path = SOCKET_DIR / f"{GATE_SOCKET_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.sock"
        self.maddr = Multiaddr(f"/unix{self.path}")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(str(self.path))
            os.chmod(self.path, 0o600)  # before listen(): nobody else connects in between
            self._sock.listen(socket.SOMAXCONN)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            self.path.unlink(missing_ok=True)
            raise
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def protocols(self) -> list[str]:
        return list(self._handlers)

    async def add_handler(self, protocol: str, handler: Handler, max_per_sender: int | None) -> None:
        """Have p2pd send `protocol`'s incoming streams here, to `handler`; a sender may have
        `max_per_sender` of them open at once (None: the handler bounds its senders itself)."""
        if self._accepting is None:
            self._accepting = asyncio.get_running_loop().create_task(self._accept_loop())
            self._accepting.add_done_callback(self._accept_loop_ended)
        request = p2pd_pb2.Request(
            type=p2pd_pb2.Request.STREAM_HANDLER,
            streamHandler=p2pd_pb2.StreamHandlerRequest(
                addr=self.maddr.to_bytes(), proto=[protocol], balanced=False
            ),
        )
        self._handlers[protocol] = (handler, max_per_sender)  # before p2pd sends the first stream
        try:
            await self._control(request)
        except BaseException:
            del self._handlers[protocol]
            raise

    async def remove_handler(self, protocol: str) -> None:
        self._handlers.pop(protocol, None)
        request = p2pd_pb2.Request(
            type=p2pd_pb2.Request.REMOVE_STREAM_HANDLER,
            removeStreamHandler=p2pd_pb2.RemoveStreamHandlerRequest(
                addr=self.maddr.to_bytes(), proto=[protocol]
            ),
        )
        await self._control(request)

    async def _control(self, request: p2pd_pb2.Request) -> None:
        async def ask() -> None:
            reader, writer = await self._daemon.open_connection()
            try:
                await write_pbmsg(writer, request)
                response = p2pd_pb2.Response()
                await read_pbmsg_safe(reader, response)
                raise_if_failed(response)
            finally:
                writer.close()

        await asyncio.wait_for(ask(), CONTROL_TIMEOUT_S)

    def _accept_loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("stream gate stopped accepting: %r", task.exception())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._acquire()
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # e.g. out of descriptors: back off rather than spin
                self._release()
                logger.warning("stream gate: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            except BaseException:
                self._release()
                raise
            task = loop.create_task(self._take(conn))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._taken, conn=conn))

    async def _acquire(self) -> None:
        if self._pending is not None:
            await self._pending.acquire()

    def _release(self) -> None:
        if self._pending is not None:
            self._pending.release()

    def _taken(self, task: asyncio.Task[None], conn: socket.socket) -> None:
        self._tasks.discard(task)
        if task.cancelled():  # at close, perhaps before it ran: the connection is still its own
            conn.close()

    async def _take(self, conn: socket.socket) -> None:
        """Read the connection's sender, then hand it over or close it. Its pending slot is given
        back once it is handed over, or once a refused one is really closed: a burst of refused
        connections must not pile up half-closed while the next burst is accepted."""
        key: tuple[str, str] | None = None
        writer: asyncio.StreamWriter | None = None
        released = False
        self._held += 1
        self.peak_open = max(self.peak_open, self._held)
        try:
            try:
                reader, writer = await asyncio.open_unix_connection(sock=conn)
                info = p2pd_pb2.StreamInfo()
                await asyncio.wait_for(read_pbmsg_safe(reader, info), INFO_TIMEOUT_S)
                stream = StreamInfo.from_protobuf(info)
                sender = stream.peer_id.to_base58()
            except (OSError, EOFError, ValueError, DecodeError, asyncio.TimeoutError) as exc:
                self.refused += 1
                logger.debug("stream closed without its StreamInfo: %r", exc)
                return
            handler, bound = self._handlers.get(stream.proto, (None, None))
            refusal = self._refusal(sender, stream.proto, handler is not None, bound)
            if refusal is not None:
                self.refused += 1
                logger.debug("stream from %s on %s closed unread: %s", sender[-8:], stream.proto, refusal)
                return
            assert handler is not None
            key = (sender, stream.proto)
            self._open[key] = self._open.get(key, 0) + 1
            self._handed += 1
            self._release()
            released = True
            await handler(stream, reader, writer)
        except Exception as exc:  # a handler's own failure must not end the gate
            logger.warning("stream handler failed: %r", exc)
        finally:
            try:
                if key is not None:
                    self._handed -= 1
                    self._open[key] -= 1
                    if not self._open[key]:
                        del self._open[key]
                if writer is None:
                    conn.close()
                else:
                    writer.close()
                    if not released:  # the event loop closes the socket a little later
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(writer.wait_closed(), CLOSE_WAIT_S)
            finally:
                self._held -= 1
                if not released:
                    self._release()

    def _refusal(self, sender: str, protocol: str, handled: bool, bound: int | None) -> str | None:
        if not handled:
            return "no handler"
        if bound is not None and self._open.get((sender, protocol), 0) >= bound:
            return f"already {bound} open"
        if self.max_open is not None and self._handed >= self.max_open and not self.favoured(sender):
            return f"already {self.max_open} streams open"
        return None

    async def close(self) -> None:
        """Stop accepting, end every connection held, remove the socket file (remove the
        handlers first, while the daemon runs)."""
        if self._closed:
            return
        self._closed = True
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._sock.close()
        self.path.unlink(missing_ok=True)


async def remove_all(gate: StreamGate) -> None:
    """Remove each of the gate's handlers from p2pd (one that fails does not stop the others:
    the daemon may be gone), then close it."""
    for protocol in gate.protocols:
        with contextlib.suppress(Exception):
            await gate.remove_handler(protocol)
    await gate.close()


async def open_gate(
    p2p: P2P, register: Callable[[StreamGate], Awaitable[None]], bounded: bool = True
) -> StreamGate:
    """A gate on `p2p` with `register`'s handlers added; if either step fails, nothing is left
    behind: the handlers added are removed, the gate closed and `p2p` (a replica) shut down."""
    try:
        gate = StreamGate(p2p) if bounded else StreamGate.unbounded(p2p)
    except BaseException:
        await p2p.shutdown()
        raise
    try:
        await register(gate)
    except BaseException:
        await remove_all(gate)
        await p2p.shutdown()
        raise
    return gate
