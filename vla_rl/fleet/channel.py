"""How a shard reaches the inference server each step: a Unix socket on the same node, Ray otherwise.

Ray places the fleet's actors and restarts them, but a Ray actor call costs 2-5 ms on a small
machine (the threads that carry it must be woken on both sides; ``scripts/bench_ray_latency.py``),
and a shard makes one per step. When a shard and the server share a node, requests travel instead
over a Unix socket that the server's own event loop reads: one wake-up per side, and the
request's bytes copied once through the kernel. Ray still carries everything else (weights, the
rollout calls, health checks, cancellation), and the socket is found through Ray, so it survives
restarts:

- the server (:class:`SocketServer`) opens a fresh socket in every incarnation and reports it
  with its node's id (``InferenceServer.socket_address``);
- a shard (:class:`SocketLink`) that loses the connection asks the server's Ray actor for the
  address again, which waits for the restart as Ray calls do, and sends every request not yet
  answered once more, as Ray retries the calls in flight to a restarted actor. The restarted
  server holds them (it has no weights) until the collector cancels them and collects the
  iteration again (:mod:`vla_rl.fleet.collector`), so no request is lost or left waiting;
- a request the server fails (cancelled because the iteration is collected again) raises its
  exception in the shard, as a failed Ray call does.

Frames on the socket: a 16-byte header (ticket, payload length) and a pickled payload
(a :class:`~vla_rl.fleet.wire.Request` one way; a ``Reply`` or an exception the other way).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import io
import itertools
import os
import pickle
import socket
import struct
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the messages' module imports torch, which a socket needs not
    from vla_rl.fleet.wire import Reply, Request

HEADER = struct.Struct("!QQ")
"""A frame's header: the request's ticket and the payload's length in bytes."""


class ChannelClosed(ConnectionError):
    """The other end of the socket went away (the server restarted, or the shard died)."""


def _frame(ticket: int, obj: Any) -> memoryview:
    """Header and pickled ``obj`` in one buffer (pickled straight after the header: no extra copy)."""
    buffer = io.BytesIO()
    buffer.write(bytes(HEADER.size))
    pickle.dump(obj, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    view = buffer.getbuffer()
    HEADER.pack_into(view, 0, ticket, len(view) - HEADER.size)
    return view


class SocketServer:
    """The server's end: answers every request arriving on a Unix socket with ``handler``.

    Runs in the event loop of the asyncio actor that calls :meth:`start`, so requests from the
    socket and from Ray calls meet in the same batches.

    Args:
        handler: coroutine function turning a request into its reply.
        owner: names the socket files of one server across its restarts, so that a restarted
            incarnation removes those its killed predecessors left (Ray restarts an actor only
            once its process is gone).
    """

    def __init__(self, handler: Callable[[Request], Awaitable[Reply]], owner: str = "") -> None:
        self.handler = handler
        self.owner = owner or uuid.uuid4().hex[:16]
        self.path = ""
        self.clients = 0
        """Shards connected now."""
        self._server: asyncio.AbstractServer | None = None
        self._listening: asyncio.Future[str] | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> str:
        """Listen on a fresh socket path (idempotent; concurrent callers share one start); returns the path."""
        if self._listening is None:
            self._listening = asyncio.ensure_future(self._listen())
        return await self._listening

    async def _listen(self) -> str:
        prefix = os.path.join(tempfile.gettempdir(), f"vla_rl-{self.owner}-")
        for stale in glob.glob(f"{prefix}*.sock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        path = f"{prefix}{uuid.uuid4().hex[:8]}.sock"
        self._server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)  # frames are pickles: only this user's processes may connect
        self.path = path
        return path

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one shard's requests until it disconnects; each is answered as soon as its batch ran."""
        self.clients += 1
        try:
            while True:
                ticket, size = HEADER.unpack(await reader.readexactly(HEADER.size))
                # A peer that can connect is a process of this user (the socket is 0600, and before the chmod
                # the umask's mode already denies others the write permission connecting needs): it could run
                # any code as this user anyway, as can the Ray workers that pickle the same objects.
                request = pickle.loads(await reader.readexactly(size))  # noqa: S301 - peer is this user's process
                task = asyncio.ensure_future(self._answer(ticket, request, writer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the shard went away; its waiting requests are cancelled by the collector
        finally:
            self.clients -= 1
            writer.close()

    async def _answer(self, ticket: int, request: Request, writer: asyncio.StreamWriter) -> None:
        try:
            result: Any = await self.handler(request)
        except Exception as exc:  # the shard re-raises it, as a failed Ray call would
            result = exc
        if not writer.is_closing():
            writer.write(_frame(ticket, result))

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        if self._server is not None:
            self._server.close()
            self._server = self._listening = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class SocketClient:
    """A blocking connection to a :class:`SocketServer`; replies may come back in any order."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise ChannelClosed(f"cannot connect to the inference server's socket {path}: {exc}") from exc
        self._header = bytearray(HEADER.size)

    def send(self, ticket: int, request: Request) -> None:
        """Send ``request`` under ``ticket``."""
        try:
            self.sock.sendall(_frame(ticket, request))
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    def receive(self) -> tuple[int, Any]:
        """The next frame: ``(ticket, reply or exception)``."""
        self._read_into(memoryview(self._header))
        ticket, size = HEADER.unpack(self._header)
        payload = bytearray(size)
        self._read_into(memoryview(payload))
        return ticket, pickle.loads(payload)  # noqa: S301 - the server is this user's process (see SocketServer._serve)

    def _read_into(self, view: memoryview) -> None:
        while len(view):
            try:
                got = self.sock.recv_into(view)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            if got == 0:
                raise ChannelClosed("the inference server closed the connection")
            view = view[got:]

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()


class RayLink:
    """Requests as Ray actor calls (shard and server on different nodes, or ``fleet.server.transport=ray``).

    Args:
        server: handle with ``infer.remote(request)``; an in-process stand-in may answer with the
            :class:`~vla_rl.fleet.wire.Reply` itself.
    """

    def __init__(self, server: Any) -> None:
        self.server = server

    def ask(self, request: Request) -> Any:
        """Send ``request``; returns what :meth:`wait` takes."""
        return self.server.infer.remote(request)

    def wait(self, ref: Any) -> Reply:
        """The reply to a request sent by :meth:`ask` (raises the server's exception if it failed)."""
        import ray

        return ray.get(ref) if isinstance(ref, ray.ObjectRef) else ref

    def forget(self) -> None:
        """Nothing to drop: every Ray call has its own reference."""

    def close(self) -> None:
        """Nothing to close."""


class SocketLink:
    """Requests over the server's Unix socket, reconnecting (and resending) after a server restart.

    Args:
        server: the server's Ray actor handle (:class:`~vla_rl.fleet.inference.InferenceServer`).
        path: its socket's path.
    """

    def __init__(self, server: Any, path: str) -> None:
        self.server = server
        self.client = SocketClient(path)
        self._tickets = itertools.count()
        self._unanswered: dict[int, Request] = {}
        self._answers: dict[int, Any] = {}

    def ask(self, request: Request) -> int:
        """Send ``request``; returns its ticket for :meth:`wait`."""
        ticket = next(self._tickets)
        self._unanswered[ticket] = request
        try:
            self.client.send(ticket, request)
        except ChannelClosed:
            self._reconnect()
        return ticket

    def wait(self, ticket: int) -> Reply:
        """The reply to ``ticket`` (raises the server's exception if it failed the request)."""
        while ticket not in self._answers:
            try:
                answered, result = self.client.receive()
            except ChannelClosed:
                self._reconnect()
                continue
            if answered in self._unanswered:  # else: a request forgotten after an aborted rollout
                del self._unanswered[answered]
                self._answers[answered] = result
        result = self._answers.pop(ticket)
        if isinstance(result, BaseException):
            raise result
        return result

    def forget(self) -> None:
        """Drop requests of an aborted rollout: their late replies are discarded when they arrive."""
        self._unanswered.clear()
        self._answers.clear()

    @property
    def held(self) -> int:
        """Requests sent whose replies were not yet taken by :meth:`wait` (answered or not)."""
        return len(self._unanswered) + len(self._answers)

    def _reconnect(self, attempts: int = 5) -> None:
        """Find the (restarted) server's new socket and send every unanswered request again."""
        import ray

        self.client.close()
        for attempt in range(attempts):
            try:
                _, path = ray.get(self.server.socket_address.remote())  # waits for a restart, as Ray calls do
                self.client = SocketClient(path)
                for ticket, request in self._unanswered.items():
                    self.client.send(ticket, request)
                return
            except ChannelClosed:
                self.client.close()
                if attempt == attempts - 1:
                    raise

    def close(self) -> None:
        """Close the connection."""
        self.client.close()


def connect(server: Any, transport: str) -> RayLink | SocketLink:
    """The shard's link to ``server``: its socket when ``transport="socket"`` and it runs on this node.

    Args:
        server: the server's Ray actor handle, or an in-process stand-in (no ``socket_address``).
        transport: ``"socket"`` (same node: Unix socket; else Ray) or ``"ray"`` (always Ray calls).
    """
    if transport == "ray" or not hasattr(server, "socket_address"):
        return RayLink(server)
    import ray

    node, path = ray.get(server.socket_address.remote())
    if node != ray.get_runtime_context().get_node_id():
        return RayLink(server)
    return SocketLink(server, path)
