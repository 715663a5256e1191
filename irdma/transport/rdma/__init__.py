"""The rdma transport, client side (``path.RdmaPath``)."""

from .path import RdmaPath, RdmaUnavailable, connect

__all__ = ["RdmaPath", "RdmaUnavailable", "connect"]
