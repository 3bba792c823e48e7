"""The policy-inference server: batches requests from simulator shards, serves versioned weights.

Shards send :class:`Request` s (an observation ``[n]`` to act on, and the final observations of
episodes truncated at their last step, whose values bootstrap the return). The server gathers
requests of one pipeline stage until ``max_batch`` environments wait, or until the first waited
``timeout_s`` (``None``: wait for a full batch), orders them by key (shard, stage) and runs the policy once on their
concatenation: ``act`` on the observations, ``value`` on the bootstrap observations. Ordered full
batches make the fleet's forward passes the in-process trainer's, sample for sample.

Observations and replies travel as flat dicts of numpy arrays (:mod:`vla_rl.fleet.wire`).

Weights arrive with a version (:meth:`InferenceCore.set_weights`); every :class:`Reply` carries
the version that produced it, and a request waits until the server holds at least its
``min_version`` — so a restarted server (which comes back without weights) holds requests until
the trainer pushes weights again, and none is answered by stale or random weights.

:class:`InferenceCore` is plain asyncio (tested without Ray); :class:`InferenceServer` is the
Ray actor around it.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from vla_rl.fleet.channel import SocketServer
from vla_rl.fleet.wire import Reply, Request, Wire, from_wire


def _size(data: Wire | None) -> int:
    return 0 if not data else len(next(iter(data.values())))


def _cat(parts: list[Wire]) -> TensorDict:
    return from_wire({key: np.concatenate([p[key] for p in parts]) for key in parts[0]})


class NoPolicyError(ValueError):
    """Weights arrived without a module at a server that holds none (it restarted since the last push)."""


class RequestsCancelled(RuntimeError):
    """Pending requests were cancelled because the iteration is being collected again."""


class InferenceCore:
    """Batching, versioned policy inference inside one asyncio loop.

    Args:
        policy: actor-critic with ``act(obs)`` and ``value(obs)``.
        max_batch: environments per forward pass (a batch is served once this many wait).
        timeout_s: serve a partial batch once its oldest request waited this long; ``None``: never.
        device: torch device of the policy.
    """

    def __init__(self, policy: nn.Module | None, max_batch: int, timeout_s: float | None, device: str = "cpu") -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be at least 1")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive, or None to wait for full batches")
        self.policy = None if policy is None else policy.eval()
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.version = -1  # no weights yet: every request waits for set_weights
        self._pending: list[tuple[Request, asyncio.Future, float]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.counters = {"infer_s": 0.0, "batches": 0.0, "envs": 0.0, "requests": 0.0}
        self.total_batches = 0  # since this incarnation started (``counters`` are reset when read)

    # ------------------------------------------------------------------------------ weights
    def set_weights(
        self, state: dict[str, torch.Tensor], version: int, rng_state: torch.Tensor | None = None,
        module: nn.Module | None = None,
    ) -> int:
        """Load ``state`` as weights ``version`` (and the torch RNG state, when given); serve what waited.

        Args:
            state: the policy's ``state_dict``.
            version: its version (never lower than the one held).
            rng_state: torch RNG state to sample with from now on (synchronous mode), or ``None``.
            module: the policy module, needed when the server holds none (first push, after a restart).

        Returns:
            The version now held.
        """
        if version < self.version:
            raise ValueError(f"weights version {version} is older than the held {self.version}; versions only grow")
        if module is not None:
            self.policy = module.eval()
        if self.policy is None:
            raise NoPolicyError("the server holds no policy module yet; pass module= with the first weights")
        self.policy.to(self.device)
        self.policy.load_state_dict(state)
        self.version = version
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        self._serve()
        return version

    def offload(self) -> None:
        """Move the model to host memory while the trainer uses the device (weights are kept)."""
        if self.policy is not None:
            self.policy.to("cpu")

    # ------------------------------------------------------------------------------ requests
    async def infer(self, request: Request) -> Reply:
        """Queue ``request`` and return its reply once its batch has run."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future, time.monotonic()))
        self.counters["requests"] += 1
        self._serve()
        return await future

    def cancel_pending(self) -> int:
        """Fail every waiting request with :class:`RequestsCancelled`; returns how many."""
        pending, self._pending = self._pending, []
        for _, future, _ in pending:
            if not future.done():
                future.set_exception(RequestsCancelled("the iteration is being collected again"))
        return len(pending)

    def _groups(self) -> list[list[tuple[Request, asyncio.Future, float]]]:
        """Requests that may be answered now, grouped by pipeline stage (``key[1]``), oldest group first."""
        groups: dict[int, list[tuple[Request, asyncio.Future, float]]] = {}
        for item in self._pending:
            if item[0].min_version <= self.version:
                groups.setdefault(item[0].key[1], []).append(item)
        return sorted(groups.values(), key=lambda g: min(p[2] for p in g))

    def _serve(self) -> None:
        """Run every full batch now; arm the timeout for a partial one.

        A batch holds requests of one stage: with P stages the shards' stage-s requests are served
        together as soon as they are all in, while the shards step their other stages.
        """
        while True:
            full = [g for g in self._groups() if sum(_size(p[0].obs) for p in g) >= self.max_batch]
            if not full:
                break
            self._run(self._take(full[0]))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        groups = self._groups()
        if groups and self.timeout_s is not None:
            wait = max(0.0, min(p[2] for p in groups[0]) + self.timeout_s - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(wait, self._flush_partial)

    def _flush_partial(self) -> None:
        self._timer = None
        groups = self._groups()
        if groups:
            self._run(self._take(groups[0]))
        self._serve()

    def _take(self, group: list[tuple[Request, asyncio.Future, float]]) -> list[tuple[Request, asyncio.Future, float]]:
        """Up to ``max_batch`` environments of ``group``, in key order (at least one request)."""
        batch, envs = [], 0
        for item in sorted(group, key=lambda p: p[0].key):
            n = _size(item[0].obs)
            if batch and envs + n > self.max_batch:
                break
            batch.append(item)
            envs += n
        taken = {id(item) for item in batch}
        self._pending = [p for p in self._pending if id(p) not in taken]
        return batch

    def _run(self, batch: list[tuple[Request, asyncio.Future, float]]) -> None:
        """One forward pass over the concatenated requests; resolve their futures."""
        start = time.perf_counter()
        acting = [r.obs for r, _, _ in batch if not r.value_only]
        valuing = [r.obs for r, _, _ in batch if r.value_only]
        boot = [r.bootstrap_obs for r, _, _ in batch if _size(r.bootstrap_obs)]
        with torch.no_grad():
            acted = self.policy.act(_cat(acting).to(self.device)).cpu() if acting else None
            values = self.policy.value(_cat(valuing).to(self.device)).cpu().numpy() if valuing else None
            boot_values = self.policy.value(_cat(boot).to(self.device)).cpu().numpy() if boot else None
        if acted is not None:
            actions, log_probs, acted_values = (acted[k].numpy() for k in ("action", "log_prob", "value"))
        a = v = b = 0
        for request, future, _ in batch:
            n, m = _size(request.obs), _size(request.bootstrap_obs)
            bootstrap = boot_values[b : b + m] if m else np.zeros(0, np.float32)
            b += m
            if request.value_only:
                reply = Reply(None, None, values[v : v + n], bootstrap, self.version)
                v += n
            else:
                reply = Reply(actions[a : a + n], log_probs[a : a + n], acted_values[a : a + n], bootstrap, self.version)
                a += n
            if not future.done():
                future.set_result(reply)
        self.counters["infer_s"] += time.perf_counter() - start
        self.counters["batches"] += 1
        self.total_batches += 1
        self.counters["envs"] += sum(_size(r.obs) for r, _, _ in batch)

    @property
    def num_pending(self) -> int:
        """Requests waiting for a batch or for weights."""
        return len(self._pending)

    def pop_counters(self) -> dict[str, float]:
        """Seconds of forward passes, batches, environments and requests served since the last call."""
        out, self.counters = self.counters, dict.fromkeys(self.counters, 0.0)
        return out


class InferenceServer:
    """Ray actor around :class:`InferenceCore` (start it with ``max_concurrency`` above the shard count).

    It starts without a policy: the first :meth:`set_weights` brings the module (pickled once;
    later only weights travel), and so does the first one after a restart. Shards on its node send
    their requests over its Unix socket (:meth:`socket_address`, :mod:`vla_rl.fleet.channel`), the
    others as :meth:`infer` calls; both meet in the same batches.

    Args:
        max_batch: environments per forward pass.
        timeout_s: partial-batch timeout, or ``None``.
        device: torch device.
        threads: torch threads of this process.
    """

    def __init__(self, max_batch: int, timeout_s: float | None, device: str = "cpu", threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.core = InferenceCore(None, max_batch, timeout_s, device)
        try:
            import ray

            context = ray.get_runtime_context()
            self.restarted = bool(context.was_current_actor_reconstructed)
            owner = context.get_actor_id() or ""
        except (ImportError, RuntimeError):
            self.restarted, owner = False, ""
        self.socket = SocketServer(self.core.infer, owner)

    async def infer(self, request: Request) -> Reply:
        """See :meth:`InferenceCore.infer`."""
        return await self.core.infer(request)

    async def socket_address(self) -> tuple[str, str]:
        """This server's Ray node id and the path of its Unix socket (opened by the first call)."""
        import ray

        return ray.get_runtime_context().get_node_id(), await self.socket.start()

    async def close_socket(self) -> None:
        """Stop listening and remove the socket file (before the job kills this actor)."""
        self.socket.close()

    async def set_weights(
        self, state: dict[str, torch.Tensor], version: int, rng_state: torch.Tensor | None = None,
        module: nn.Module | None = None,
    ) -> int:
        """See :meth:`InferenceCore.set_weights`."""
        return self.core.set_weights(state, version, rng_state, module)

    async def status(self) -> dict[str, float]:
        """Held version, whether this incarnation is a restart, requests waiting, batches served, shards
        connected to its socket."""
        core = self.core
        return {"version": core.version, "restarted": self.restarted, "pending": core.num_pending,
                "batches": core.total_batches, "socket_clients": self.socket.clients}

    async def rng_state(self) -> torch.Tensor:
        """The torch RNG state of the server process (sampling advanced it)."""
        return torch.get_rng_state()

    async def cancel_pending(self) -> int:
        """See :meth:`InferenceCore.cancel_pending`."""
        return self.core.cancel_pending()

    async def offload(self) -> None:
        """See :meth:`InferenceCore.offload`."""
        self.core.offload()

    async def pop_counters(self) -> dict[str, float]:
        """See :meth:`InferenceCore.pop_counters`."""
        return self.core.pop_counters()
