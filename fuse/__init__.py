"""The irdma FUSE filesystem (installed as the ``irdma_fuse`` package)."""
