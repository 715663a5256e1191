"""The rdma transport, client side (``path.RdmaPath``): a connection's bulk path over
an RC queue pair (``link``, its completions in ``completions``), with one-sided pulls
of the daemon's directory (``onesided``)."""

from .path import RdmaPath, RdmaUnavailable, connect

__all__ = ["RdmaPath", "RdmaUnavailable", "connect"]
