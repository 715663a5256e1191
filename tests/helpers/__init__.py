"""What the tests share, by role (docs/testing.md): fixtures live in conftest.py and
import from here; a test imports helpers from here, never from conftest.py.

- ``cluster``: daemons started from a generated config (``make_cluster``).
- ``processes``: stopping and finding processes.
- ``wire``: raw frames over a blocking socket (HELLO, AUTH, whole frames), raw
  connections to a daemon's same-host socket.
- ``mounts``: ``irdma mount`` processes and their mount points.
- ``netns``: an emulated network of hosts (network namespaces).
- ``etcd``: a real etcd server.
- ``stores``: in-process arenas and stores (no daemon), and what tests read from them.
- ``payloads``: bytes for tests (seeded random bytes, .npy files), arrays compared by bytes.
- ``clock``: a clock the test moves.
- ``vm``: whether a qemu guest can be booted here (the RDMA and systemd suites).
- ``rdma``: whether this host has a verbs device, and clusters on it.
- ``fuse_roles``, ``fuzz_harness``, ``whole_reads``: one job each, see their docstrings.

Nothing is imported here, so that each test loads only the helpers it uses.
"""
