"""Transports: one interface (base), one module per way of moving bytes."""
