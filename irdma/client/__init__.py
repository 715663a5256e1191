"""The irdma client: an async client under trio and a blocking facade.

A tensor's bytes are cut into shards placed by rendezvous hashing; the client
moves every shard to or from its daemon in parallel, each straight between
the caller's array and the socket. Metadata is cached per tensor name and
revalidated when a daemon says the layout changed or the tensor is gone.

One role per module:

- ``facade``: ``AsyncClient``, the public API; ``blocking``: ``Client``.
- ``shells``: where requests run (trio, or the calling thread).
- ``session``: connections, and the one place stream errors and daemon
  refusals become irdma errors.
- ``cache``, ``lookup``, ``namespace``: the metadata cache, which tensor a
  name stands for, and create / rename / delete / list.
- ``planner`` (no I/O): pieces, wire slices, stamps, txns and replica choice
  for one call, single or batched; ``arrays``: the caller's arrays checked.
- ``datapath``: runs a single call's plan, ``agreement`` makes a read of
  several shards one write's, ``sinks`` land reply payloads; ``batching``:
  batched calls; ``onesided``: reads copied out of a daemon's arena;
  ``ranges``: byte ranges cut at shard boundaries.
- ``routing``: replica order and failover; ``retry``: every retry's deadline
  and pause; ``stamps``: whole-write stamps, unique and ordered; ``leases``:
  a reader's lease on one whole-tensor write (the daemons keep it).
- ``versions``: a model's tensors committed together as numbered versions;
  ``manifests`` (no I/O): the names they are stored under, and the
  manifest that commits one.
"""

from .arrays import as_stored_array
from .blocking import Client
from .datapath import Contention
from .facade import AsyncClient
from .leases import ReadLease
from .lookup import TensorInfo
from .versions import ModelVersions, Snapshot

__all__ = [
    "AsyncClient",
    "Client",
    "Contention",
    "ModelVersions",
    "ReadLease",
    "Snapshot",
    "TensorInfo",
    "as_stored_array",
]
