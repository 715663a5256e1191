"""The irdma client: an async client under trio and a blocking facade.

A tensor's bytes are cut into shards placed by rendezvous hashing; the client
moves every shard to or from its daemon in parallel, each straight between
the caller's array and the socket. Metadata is cached per tensor name and
revalidated when a daemon says the layout changed or the tensor is gone.
"""

from .arrays import as_stored_array
from .blocking import Client
from .facade import AsyncClient
from .lookup import TensorInfo

__all__ = ["AsyncClient", "Client", "TensorInfo", "as_stored_array"]
