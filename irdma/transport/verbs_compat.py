"""What differs between pyverbs releases, in one place.

Debian bookworm ships rdma-core 44, Ubuntu 24.04 ships 50, PyPI has 59+.
The differences irdma meets:

- The enums module: ``pyverbs.enums`` up to 58, ``pyverbs.libibverbs_enums``
  from 59 on.
- ``CompChannel.fd`` (the completion channel's file descriptor, which lets
  trio wait for completions instead of polling) exists from rdma-core 57 on.

Nothing else in irdma imports pyverbs directly, so a host without it (or
without an RDMA device) only loses the rdma transport.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class VerbsUnavailable(Exception):
    """pyverbs cannot be imported here (not installed, or libibverbs missing)."""


def load() -> ModuleType:
    """The pyverbs enums module; raises VerbsUnavailable with the reason."""
    errors = []
    for name in ("pyverbs.libibverbs_enums", "pyverbs.enums"):
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise VerbsUnavailable("pyverbs is not installed (" + "; ".join(errors) + ")")


def comp_channel_fd(channel: Any) -> int | None:
    """The completion channel's fd (rdma-core >= 57), or None where pyverbs hides it."""
    fd = getattr(channel, "fd", None)
    return fd if isinstance(fd, int) and fd >= 0 else None


def pyverbs_version() -> str:
    """rdma-core's version as pyverbs reports it, or "unknown" (older releases say nothing)."""
    try:
        module = importlib.import_module("pyverbs")
    except ImportError:
        return "absent"
    return str(getattr(module, "__version__", "unknown"))
