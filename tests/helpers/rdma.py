"""Whether this host has a verbs device for the RDMA suite (tests/rdma), and
clusters on it. These hosts have none: ``tests/rdma/test_in_vm.py`` runs the
suite in a qemu guest with soft-RoCE (rxe0 on 198.18.0.1)."""

from __future__ import annotations

import os
from pathlib import Path

from irdma.transport.verbs import NoDevice, find_gid
from irdma.transport.verbs_compat import VerbsUnavailable, load

from .cluster import Cluster, make_cluster

RDMA_IP = os.environ.get("IRDMA_RDMA_IP", "198.18.0.1")
SHARD = 1 << 20


def rdma_problem() -> str | None:
    """Why this host cannot run the RDMA suite, or None when it can."""
    try:
        load()
        find_gid(RDMA_IP)
    except (VerbsUnavailable, NoDevice) as exc:
        return str(exc)
    return None


def fresh(path: Path, rdma_device: str, **kwargs: object) -> Cluster:
    return make_cluster(path, host=rdma_device, scheme="rdma", **kwargs)  # type: ignore[arg-type]
