"""A local Ray cluster whose scheduler service this test process started (so it is the admin), and its
tenants' clients: shared by the identity and the security tests."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def admin_ray_cluster(config_dir: Path, num_cpus: int) -> Iterator:
    """A one-node local Ray cluster (loopback, Ray's token on) whose scheduler service this process starts,
    so it holds the admin token (kept in ``config_dir``, not the real home); yields the admin's client."""
    import ray

    from infra.ray_cluster.realize import LOOPBACK, secure_local_ray
    from infra.service.client import connect

    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(config_dir)
    secure_local_ray()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOOPBACK)
    try:
        yield connect(poll_s=0.2, owner_lease_s=600)
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("XDG_CONFIG_HOME", None)
        else:
            os.environ["XDG_CONFIG_HOME"] = old


def tenant_client(admin, tmp_path: Path, name: str):
    """A client holding a fresh token of tenant ``name``, as its user would after `token issue`."""
    from infra.service.actor import write_token
    from infra.service.client import connect

    path = tmp_path / f"{name}.token"
    write_token(path, admin.issue_token(name))
    return connect(start_service=False, token_file=path)
