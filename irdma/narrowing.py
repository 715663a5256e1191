"""Floats sent narrower than they are stored: float16 or bfloat16 on the wire.

A float32 (or float64) tensor can be pushed and pulled with half the bytes
(or less) on every link: the sender rounds each value to the wire dtype
(round to nearest even, as numpy and torch do), the receiver widens it
exactly. The daemon widens an incoming delta before it is added, so sums
are kept at the tensor's precision (float32 for float32), not the wire's;
a read narrows only the answer. This module is the one place both the
client and the daemon convert.

bfloat16 values travel as their uint16 bit patterns (the upper half of a
float32); callers may hand them over as such bits or as an ml_dtypes
bfloat16 array. Rounding is ml_dtypes' cast (round to nearest even).
"""

from __future__ import annotations

import numpy as np

from .dtypes import BFLOAT16
from .protocol import DTYPE_CODES, WIRE_BFLOAT16, WIRE_NAMES

# What each wire code's values are held in on this side (bfloat16: its bits).
_HOLDERS: dict[int, np.dtype] = {
    DTYPE_CODES["float16"]: np.dtype("<f2"),
    DTYPE_CODES["float32"]: np.dtype("<f4"),
    WIRE_BFLOAT16: np.dtype("<u2"),
}
# Which stored dtypes each wire dtype may stand for: only narrower (or equal) floats.
_WIDENS_TO = {
    DTYPE_CODES["float16"]: frozenset({np.dtype("<f4"), np.dtype("<f8")}),
    DTYPE_CODES["float32"]: frozenset({np.dtype("<f8")}),
    WIRE_BFLOAT16: frozenset({np.dtype("<f4"), np.dtype("<f8")}),
}


def wire_code(name: str | None) -> int:
    """The wire code of ``"float16"``, ``"bfloat16"`` or ``"float32"``; 0 for None (as stored)."""
    if name is None:
        return 0
    for code, wname in WIRE_NAMES.items():
        if wname == name:
            return code
    raise ValueError(f"unknown wire dtype {name!r}; use one of {', '.join(WIRE_NAMES.values())}")


def holder(code: int) -> np.dtype:
    """The numpy dtype values of wire ``code`` are held in (bfloat16: uint16 bits)."""
    return _HOLDERS[code]


def check(stored: np.dtype, code: int) -> np.dtype:
    """The holder dtype of wire ``code`` for a tensor of ``stored``; ValueError if it cannot be."""
    widens = _WIDENS_TO.get(code)
    if widens is None:
        raise ValueError(f"unknown wire dtype code {code}")
    if stored not in widens:
        raise ValueError(
            f"a {stored} tensor cannot travel as {WIRE_NAMES[code]}: "
            "the wire dtype must be a narrower float"
        )
    return _HOLDERS[code]


def wire_nbytes(stored: np.dtype, code: int, nbytes: int) -> int:
    """Bytes on the wire for ``nbytes`` of a ``stored`` tensor (``nbytes`` whole elements)."""
    return nbytes // stored.itemsize * _HOLDERS[code].itemsize


def is_held(values: object, code: int) -> bool:
    """Whether ``values`` already holds wire ``code``'s values (float16; bfloat16, or its bits)."""
    if not isinstance(values, np.ndarray):
        return False
    return values.dtype == _HOLDERS[code] or (code == WIRE_BFLOAT16 and values.dtype == BFLOAT16)


def narrow(values: np.ndarray, code: int) -> np.ndarray:
    """``values`` (a float array) rounded to wire ``code``, as the holder dtype; a new array.

    An array already holding the wire's values (``is_held``) is returned as
    the holder dtype without rounding (a caller may round itself, e.g.
    torch's bfloat16 bits).
    """
    holder = _HOLDERS[code]
    if values.dtype == holder:
        return values
    if code == WIRE_BFLOAT16 and values.dtype == BFLOAT16:
        return values.view(holder)
    # Out of the narrower range is inf, as a cast is; not an error.
    with np.errstate(over="ignore", invalid="ignore"):
        if code != WIRE_BFLOAT16:
            return values.astype(holder)
        # Through float32, as torch's float64 -> bfloat16 goes; NaN stays NaN.
        return np.asarray(values, dtype="<f4").astype(BFLOAT16).view(holder)


def widen_into(wire: np.ndarray, code: int, out: np.ndarray) -> None:
    """Widen ``wire`` (holder dtype) into ``out`` (the stored dtype, same length), exactly."""
    if code == WIRE_BFLOAT16:
        if out.dtype == np.dtype("<f4"):
            # A bfloat16 is a float32's upper half: the shift is exact and
            # many times faster than ml_dtypes' cast.
            np.left_shift(wire, 16, out=out.view("<u4"), dtype="<u4")
            return
        out[...] = wire.view(BFLOAT16)
        return
    out[...] = wire
