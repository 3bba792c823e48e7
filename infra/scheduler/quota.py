"""Per-tenant GPU quotas with borrowing, after Kueue's ClusterQueues in one cohort.

Each tenant has a *nominal* GPU quota (milli-GPU). A gang of tenant ``t`` asking for ``d`` milli-GPU
is admitted

* within its quota when ``usage[t] + d <= nominal[t]``;
* by *borrowing* idle quota of the other tenants otherwise, when the cohort has room
  (``sum(usage) + d <= sum(nominal)``) and the tenant's excess stays within its
  ``borrowing_limit`` (None: no limit).

A tenant whose usage is above its nominal quota is *borrowing*; its gangs may be preempted by a
tenant that reclaims its own nominal quota, whatever their priorities (Kueue's
``reclaimWithinCohort: Any``). Within one tenant, preemption goes by priority.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.scheduler.requests import RequestError


@dataclass(frozen=True)
class Quota:
    """GPU quota of one tenant.

    Attributes:
        gpu_milli: nominal quota in milli-GPU (1000 = one GPU), >= 0.
        borrowing_limit_milli: most milli-GPU the tenant may use beyond its nominal quota
            (None: any idle quota of the cohort).
    """

    gpu_milli: int
    borrowing_limit_milli: int | None = None

    def __post_init__(self) -> None:
        if self.gpu_milli < 0 or (self.borrowing_limit_milli is not None and self.borrowing_limit_milli < 0):
            raise ValueError(f"{self}: quotas and borrowing limits are milli-GPU amounts >= 0.")


class QuotaLedger:
    """GPU usage per tenant against its quota; with no quotas every gang is admitted.

    Args:
        quotas: tenant name -> quota; None or empty switches quotas off.
    """

    def __init__(self, quotas: dict[str, Quota] | None = None) -> None:
        self.quotas = dict(quotas or {})
        self.usage: dict[str, int] = dict.fromkeys(self.quotas, 0)

    @property
    def enabled(self) -> bool:
        """Whether quotas are enforced."""
        return bool(self.quotas)

    def check_tenant(self, tenant: str, gang: str) -> None:
        """Raise ``RequestError`` for a tenant without a quota (when quotas are enforced)."""
        if self.enabled and tenant not in self.quotas:
            raise RequestError(
                f"gang {gang!r}: tenant {tenant!r} has no GPU quota; tenants are {sorted(self.quotas)}."
            )

    def admissible(self, tenant: str, milli: int, freed: dict[str, int] | None = None) -> bool:
        """Whether ``milli`` more milli-GPU may go to ``tenant`` (after ``freed`` usage per tenant is returned)."""
        if not self.enabled or milli == 0:
            return True
        freed = freed or {}
        use = {t: u - freed.get(t, 0) for t, u in self.usage.items()}
        q = self.quotas[tenant]
        if use[tenant] + milli <= q.gpu_milli:
            return True
        if q.borrowing_limit_milli is not None and use[tenant] + milli - q.gpu_milli > q.borrowing_limit_milli:
            return False
        return sum(use.values()) + milli <= sum(x.gpu_milli for x in self.quotas.values())

    def within_nominal(self, tenant: str, milli: int) -> bool:
        """Whether ``tenant`` stays within its nominal quota with ``milli`` more (it may then reclaim)."""
        return not self.enabled or self.usage[tenant] + milli <= self.quotas[tenant].gpu_milli

    def borrowing(self, tenant: str) -> bool:
        """Whether ``tenant`` uses more than its nominal quota."""
        return self.enabled and self.usage[tenant] > self.quotas[tenant].gpu_milli

    def add(self, tenant: str, milli: int) -> None:
        """Record ``milli`` (negative: returned) milli-GPU of usage."""
        if self.enabled:
            self.usage[tenant] += milli

    def why_not(self, tenant: str, milli: int) -> str:
        """Why ``milli`` more milli-GPU are not admissible for ``tenant`` (for timeouts and status)."""
        q = self.quotas[tenant]
        idle = sum(x.gpu_milli for x in self.quotas.values()) - sum(self.usage.values())
        limit = "no borrowing limit" if q.borrowing_limit_milli is None else f"borrowing limit {q.borrowing_limit_milli}"
        return (
            f"tenant {tenant!r} quota: uses {self.usage[tenant]} of its nominal {q.gpu_milli} milli-GPU "
            f"({limit}), asks {milli} more, and the cohort has {max(idle, 0)} milli-GPU of idle quota"
        )
