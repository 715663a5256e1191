"""The element types irdma stores that numpy lacks: bfloat16 and float8.

numpy has no bfloat16 or float8; ``ml_dtypes`` (what JAX and TensorFlow use)
adds them as real numpy dtypes, with casts that round to nearest even and
arithmetic. Importing this module registers their names with numpy, so
``np.dtype("bfloat16")`` works everywhere irdma runs.

They are summed and scaled in float32 and rounded back once (``COMPUTE``):
their own arithmetic would round at every step, and an accumulate's
``alpha`` would be rounded to the narrow type before it is used.

numpy's own ``.npy`` writer cannot name them (it writes bfloat16 as the
untyped ``|V2``, float8_e5m2 as ``<f1``, which it cannot read back), so irdma
writes the dtype's name as the header's descr (``npy_descr``): ``np.load``
reads that once ``ml_dtypes`` is imported.
"""

from __future__ import annotations

import io
from typing import Any

import ml_dtypes
import numpy as np
from numpy.lib import format as npformat

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
FLOAT8_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
# The floats numpy knows only through ml_dtypes, by name.
NARROW_FLOATS: dict[str, np.dtype] = {dt.name: dt for dt in (BFLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2)}
# What a narrow float is scaled and summed in before it is rounded back.
COMPUTE = np.dtype("<f4")


def is_narrow_float(dtype: Any) -> bool:
    """Whether ``dtype`` is bfloat16 or a float8 (an ml_dtypes float)."""
    return np.dtype(dtype) in _NARROW


_NARROW = frozenset(NARROW_FLOATS.values())


def npy_descr(dtype: Any) -> str | list[Any]:
    """The .npy header's descr for ``dtype``: numpy's (a list of fields for a
    structured dtype), or the name of a narrow float."""
    dt = np.dtype(dtype)
    if dt in _NARROW:
        return dt.name
    return npformat.dtype_to_descr(dt)


def npy_header(dtype: Any, shape: tuple[int, ...]) -> bytes:
    """The .npy header (magic, version, dict, padding) of a C-order array,
    version 1.0 where it fits, as numpy.save writes it, with ``npy_descr``; always
    little-endian, as irdma stores and sends tensors."""
    descr = npy_descr(np.dtype(dtype).newbyteorder("<"))
    d = {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        npformat.write_array_header_1_0(buf, d)
    except ValueError:  # a header over 64 KiB (very many dimensions)
        buf = io.BytesIO()
        npformat.write_array_header_2_0(buf, d)
    return buf.getvalue()
