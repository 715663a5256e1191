"""Bytes for tests: seeded random bytes, what ``np.save`` writes, arrays compared
by their bytes."""

from __future__ import annotations

import io

import numpy as np


def rand_bytes(n: int, seed: int = 0) -> bytes:
    """``n`` bytes, the same for the same ``seed``."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def npy_bytes(arr: np.ndarray, **kwargs) -> bytes:
    """The .npy file ``np.save`` writes for ``arr`` (``kwargs`` go to it)."""
    buf = io.BytesIO()
    np.save(buf, arr, **kwargs)
    return buf.getvalue()


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and bytes (NaNs compared by their bits)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
