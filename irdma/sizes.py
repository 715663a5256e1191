"""The sizes that decide how bytes travel between a client and a daemon, in one place.

Each transport reads its thresholds from here (client and daemon alike), so
"large" means the same thing on both ends of every connection.
"""

from __future__ import annotations

# Writes and accumulates below this go inline over the socket; from it up, an
# shm client copies them into its staging memory and sends STAGED (a copy into
# staging does not pay for itself on smaller payloads).
INLINE_MAX = 64 << 10

# Reads at least this large leave the daemon without a copy in its process:
# over TCP with sendfile from the arena (pinned until RELEASE), over shm as a
# MAPPED answer the client copies out of its mapping of the arena.
ZERO_COPY_MIN = 256 << 10

# One-sided reads of at least this many bytes (several shards) copy on two
# threads (``transport.direct.Copier``): one thread copying shard by shard
# reaches about a third of one large copy's speed, two reach about all of it.
PARALLEL_COPY_MIN = 8 << 20


# Over RDMA every read is one-sided (READs of the directory slot and the bytes,
# no message to the daemon), in chains of READs one at a time per connection:
# pulls queued together share a chain up to this many bytes; a larger one (a
# shard of 4 MiB) READs its slot first, then its bytes where the slot says, so a
# shard rewritten since the last read costs no wasted transfer. In the soft-RoCE
# guest (2026-11-24, `bench/rdma_vm.sh --rounds 3`, 64 MiB of 4 MiB shards) this
# read at 41.7-45.0 MB/s with the daemon's CPU at 0.00-0.07 of TCP's (0 or 1
# tick of 10 ms), against 43.9 MB/s and 0.33 when pulls over 1 MiB asked it;
# at 256 MiB the daemon's CPU during such reads is what it spends idle.
RDMA_BATCH_BYTES = 2 << 20

# Over RDMA every read that asks the daemon (one-sided ones that must: a daemon
# catching up, a shard changing too often) is answered MAPPED: the client READs
# the bytes itself.
RDMA_MAPPED_MIN = 1

# Answers with at most this much payload are joined to their header and sent
# as one buffer (a copy this small costs less than a scatter list).
SMALL_REPLY = 64 << 10

# Staging memory per connection, as the client asks for it: at least this,
# and room for a few shards (shm: 4, rdma: 2) in flight.
SHM_STAGING_MIN = 16 << 20
RDMA_STAGING_MIN = 4 << 20
# What a daemon accepts as an RDMA connection's staging area (it is a block of
# its arena, for that connection alone).
RDMA_STAGING_ACCEPTED = (64 << 10, 256 << 20)
# Alignment of each request's room in staging memory.
STAGING_ALIGN = 64
# A daemon applies an accumulate straight from the client's shared memory in
# pieces of this many bytes: scaled in a scratch buffer that stays in cache.
ACCUMULATE_PIECE = 256 << 10


def shm_staging_size(shard_size: int) -> int:
    """Staging memory of one shm connection: room for four shards in flight."""
    return max(SHM_STAGING_MIN, 4 * shard_size)


def rdma_staging_size(shard_size: int) -> int:
    """Staging memory (and registered buffer) of one RDMA connection: two shards."""
    return max(RDMA_STAGING_MIN, 2 * shard_size)
