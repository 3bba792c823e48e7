"""Where a gang goes: the largest size of it that fits now and that quotas admit, and elastic resizes.

``Placing`` asks the gang placer (``infra.scheduler.gang_placer``) for all of a gang's bundles
at once, trying smaller sizes of an elastic gang down to its minimum; a size is tried only when
the tenant's quota admits it and it leaves the reserved gang the quota it needs.
"""

from __future__ import annotations

from collections import Counter

from infra.scheduler.events import EventKind
from infra.scheduler.gang_book import Gang, GangBook, GangState
from infra.scheduler.gang_placer import GangPlacer
from infra.scheduler.requests import RequestError
from infra.scheduler.reservation_keeper import ReservationKeeper
from infra.scheduler.resources import Alloc


class Placing:
    """Finds allocations for gangs; see the module docstring.

    Args:
        book: the gangs, the cluster state and the quota ledger.
        placer: places a gang's bundles with the scheduler's policy.
        keeper: the reservation whose quota later gangs must spare.
    """

    def __init__(self, book: GangBook, placer: GangPlacer, keeper: ReservationKeeper) -> None:
        self.book = book
        self.placer = placer
        self.keeper = keeper

    def place(self, g: Gang, returned: Counter | None = None) -> list[tuple[int, Alloc]] | None:
        """Allocations for the largest size of ``g`` that fits and its quota admits (once ``returned``
        usage per tenant is given back, during a preemption search), or None."""
        req = g.req
        want = list(range(len(req.bundles)))
        for size in range(len(want), req.min_size - 1, -1):
            if not self.quota_admits(g, req.gpu_milli(size), returned):
                continue
            got = self.placer.place(req, want[:size], self.book.services)
            if got is not None:
                return got
        return None

    def quota_admits(self, g: Gang, milli: int, returned: Counter | None = None) -> bool:
        """Whether ``g``'s quota admits ``milli`` more (once ``returned`` went back), sparing the reserved gang's."""
        return self.book.ledger.admissible(g.req.tenant, milli, returned) and self.keeper.spares_quota(g, milli, returned)

    def resize(self, g: Gang, num_bundles: int, now: float) -> int:
        """Grow or shrink placed elastic gang ``g`` to ``num_bundles`` (all added bundles or none); the
        change in its number of bundles (negative when it shrank: resources came back).

        Raises:
            RequestError: not elastic, not placed, or size outside ``[min_bundles, len(bundles)]``.
            RuntimeError: growing does not fit now, or its quota does not admit it (it keeps its size).
        """
        req, name = g.req, g.req.name
        if req.min_bundles is None:
            raise RequestError(f"gang {name!r} is not elastic; submit it with min_bundles to resize it.")
        if g.state is not GangState.PLACED:
            raise RequestError(f"gang {name!r} is {g.state.value}; resize it once it is placed.")
        if not req.min_size <= num_bundles <= len(req.bundles):
            raise RequestError(f"gang {name!r}: size {num_bundles} outside [{req.min_size}, {len(req.bundles)}].")
        have = sorted(g.allocs)
        if num_bundles < len(have):
            drop = have[num_bundles:]
            self.book.take_out(g, drop, free=True)
            self.book.log.add(EventKind.RESIZED, name, now, size=num_bundles, removed=drop)
        elif num_bundles > len(have):
            add = [b for b in range(len(req.bundles)) if b not in g.allocs][: num_bundles - len(have)]
            extra = sum(req.bundles[b].total_gpu_milli for b in add)
            got = None
            if self.quota_admits(g, extra):
                got = self.placer.place(req, add, self.book.services, {b: a.node for b, a in g.allocs.items()})
            if got is None:
                raise RuntimeError(f"gang {name!r}: {len(add)} more bundles do not fit now; it keeps {len(have)}.")
            self.book.put_in(g, got)
            self.book.log.add(EventKind.RESIZED, name, now, size=num_bundles, added=add, nodes=self.book.node_names(got))
        return num_bundles - len(have)
