"""fuse/backend.py: the roles' links to the daemons before the trio loop runs (pure)."""

from __future__ import annotations

import errno

import pytest
from irdma_fuse.backend import Backend
from irdma_fuse.errors import FsError


def test_without_a_client_or_nursery_every_call_is_eio() -> None:
    backend = Backend()
    for use in (lambda: backend.c, lambda: backend.n):
        with pytest.raises(FsError) as caught:
            use()
        assert caught.value.errno == errno.EIO
