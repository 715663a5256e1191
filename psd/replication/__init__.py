"""Keeping a daemon's shards identical on their replicas (``replicator``)."""

from .replicator import CopyCounts, Item, PeerError, Refused, Replicator

__all__ = ["CopyCounts", "Item", "PeerError", "Refused", "Replicator"]
