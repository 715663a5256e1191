"""irdma's own FUSE session: the kernel's protocol spoken on /dev/fuse, without libfuse.

``abi`` defines the kernel's structs and flags once; ``requests`` decodes a
message into one frozen dataclass per request and ``replies`` encodes the
answers (sans-IO: bytes in, bytes out, tested without a mount); ``init``
negotiates the protocol. ``device`` mounts and talks to /dev/fuse,
``backing`` keeps readers' files in memfds the kernel reads directly
(passthrough), ``session`` is the trio loop and ``adapter`` answers each
request with ``fuse.filesystem.Filesystem`` (the operations pyfuse3's adapter
serves too).
"""
