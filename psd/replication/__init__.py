"""Keeping a daemon's shards identical on their replicas, one role per module:

- ``replicator``: ``Replicator``, the composition the daemon runs;
- ``links``: the connection to one peer (``PeerError``, ``Refused``);
- ``peers``: the peers by name, each with its link, forward queue and tasks;
- ``queues``: what waits to be sent to one peer (``Item``);
- ``heartbeats``: pings and their answers, each side's state;
- ``forwarding``: queueing updates for the backups, sending them in order,
  and what acknowledging an update waits for;
- ``debts``: the resyncs owed to backups declared down (updates acknowledged
  without them), said in heartbeats and settled by their handoff;
- ``delivery``: one forwarded update or one whole shard sent to a peer;
- ``catchup_plan``: the catch-up decision, a pure function;
- ``catchup``: asking the peers, taking the copies, the handoff;
- ``catchup_service``: answering a peer's catch-up and copy requests;
- ``following``: settling on a new epoch, dropping what it left out, a move's gains;
- ``vetting``: whose updates and copies this daemon takes; installing a copy;
- ``bodies``: the JSON bodies of these messages, typed.

- **Heartbeats.** Every ``heartbeat`` seconds the daemon pings each peer and
  records who answered (``Membership``).
- **Forwarding.** An update applied here as a shard's primary is queued,
  in the order it was applied, for every backup of the shard that is up; one
  task per peer sends the queue in order over one connection, so backups
  apply the same updates in the same order (byte-identical copies). A backup
  that missed updates answers BEHIND and is sent the whole shard instead.
  The client's update is acknowledged once every backup that is up has it;
  a backup declared down is owed a resync, which the primary's heartbeats
  tell it, so one that stayed ready (it kept hearing a majority) catches up.
- **Catching up.** A daemon that starts, or that was cut off long enough to
  have been declared down, asks its peers which shards they hold (versions
  and checksums), has the current copy of each of its shards pushed to it,
  and only then announces itself ready; each peer first sends it everything
  it queued for it, so no update falls between the copy and the handoff.
- **Whose copies count.** A daemon takes forwarded updates and shard copies
  only from a peer it sees as up and ready (and never for a shard it is the
  acting primary of), or, while catching up, from the peer it asked. A
  primary that was paused or cut off and comes back with stale queued
  updates is refused, drops them, and catches up like any rejoining daemon.
- **Moves** (with etcd, ``irdma.cluster.epochs``). While an epoch names a target
  member list, updates are also forwarded to the daemons that gain a shard in
  it, and each of them copies what it gains from the shard's acting primary
  (``following``), then says so in etcd; once all have, the steward switches
  the epoch. After a switch, once settled, a daemon drops the copies it no
  longer keeps. Copies travel only between daemons of the same epoch.
"""

from .delivery import CopyCounts
from .forwarding import Forwarding
from .links import PeerError, Refused
from .queues import Item
from .replicator import Replicator

__all__ = ["CopyCounts", "Forwarding", "Item", "PeerError", "Refused", "Replicator"]
