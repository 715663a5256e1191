"""The caller's arrays as the client takes them: stored dtypes, checked shapes, bytes.

Pure checks and conversions: an array to write becomes a C-contiguous
little-endian array of a dtype irdma stores; a read's ``out`` and an
accumulate's delta are checked against the tensor; a delta travels in the
wire dtype the planner chose (``planner.wire_for``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import narrowing
from ..errors import DtypeMismatch, ShapeMismatch
from ..protocol import DTYPE_CODES, Status, TensorMeta, dtype_code
from ..transport.shared import SharedRegion

# The dtypes irdma stores, as arrays carry them (little-endian): checking a
# dtype by name costs microseconds on every small write otherwise.
_STORED_DTYPES = frozenset(np.dtype(name).newbyteorder("<") for name in DTYPE_CODES)


def as_stored_array(array: Any) -> np.ndarray:
    """A C-contiguous little-endian array of a dtype irdma stores (copies only if needed)."""
    arr = np.asarray(array)
    if arr.dtype not in _STORED_DTYPES:
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        dtype_code(arr.dtype)  # raises ValueError for object, string, structured dtypes
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def shared_array(region: SharedRegion, shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype`` in ``region`` (SharedMemoryFull
    when it has no room left)."""
    dt = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    return region.empty(nbytes).view(dt).reshape(shape)


def byte_view(arr: np.ndarray) -> memoryview:
    """The array's bytes, flat."""
    return arr.reshape(-1).view(np.uint8).data


def fits(meta: TensorMeta, dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    """Whether an array of ``dtype`` and ``shape`` (a stored array's: little-endian)
    is the tensor's dtype and shape."""
    return dtype == meta.np_dtype and shape == meta.shape


def check_out(meta: TensorMeta, out: np.ndarray) -> None:
    """Raise unless ``out`` can take the tensor's values as they are."""
    if out.dtype != meta.np_dtype:
        raise DtypeMismatch(f"out has dtype {out.dtype}, tensor {meta.name!r} is {meta.dtype}")
    if out.shape != meta.shape:
        raise ShapeMismatch(f"out has shape {out.shape}, tensor {meta.name!r} is {meta.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")


def delta_array(delta: Any, code: int) -> np.ndarray:
    """A delta as the client takes it: already in wire dtype ``code`` (float16
    values, or bfloat16 as uint16 bit patterns) as it is, else a stored array."""
    return delta if code and narrowing.is_held(delta, code) else as_stored_array(delta)


def narrowed_delta(meta: TensorMeta, arr: np.ndarray, wire: int) -> np.ndarray:
    """A delta checked against ``meta`` and, with the ``wire`` dtype the planner
    chose for this tensor (0: none), in that dtype."""
    if wire and narrowing.is_held(arr, wire):
        if arr.shape != meta.shape:
            raise ShapeMismatch(
                f"delta has shape {arr.shape}, tensor {meta.name!r} is {meta.shape}",
                Status.SHAPE_MISMATCH,
            )
        return narrowing.narrow(np.ascontiguousarray(arr), wire)
    check_delta(meta, arr)
    return narrowing.narrow(arr, wire) if wire else arr


def check_delta(meta: TensorMeta, arr: np.ndarray) -> None:
    if arr.dtype != meta.np_dtype:
        raise DtypeMismatch(
            f"delta has dtype {arr.dtype}, tensor {meta.name!r} is {meta.dtype}",
            Status.DTYPE_MISMATCH,
        )
    if arr.shape != meta.shape:
        raise ShapeMismatch(
            f"delta has shape {arr.shape}, tensor {meta.name!r} is {meta.shape}",
            Status.SHAPE_MISMATCH,
        )
