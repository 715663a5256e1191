""".npy headers: what a tensor looks like as a file, and parsing one written to us."""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.lib import format as npformat

from irdma import npy_header


class BadNpy(ValueError):
    """Bytes written to a .npy path that are not a .npy file irdma can store."""


@lru_cache(maxsize=4096)
def header_for(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header (magic, version, dict, padding to 64 bytes) for a C-order array.

    A bfloat16 or float8 header names its dtype (numpy's own writer cannot):
    ``np.load`` reads it with ml_dtypes imported (``irdma.npy_header``).
    """
    return npy_header(dtype, shape)


@dataclass(frozen=True, slots=True)
class NpyLayout:
    dtype: np.dtype
    shape: tuple[int, ...]
    header_len: int

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def parse_header(data: bytes | bytearray | memoryview) -> NpyLayout:
    """Parse the header at the start of ``data``; raises BadNpy naming the problem."""
    f = io.BytesIO(bytes(data[: min(len(data), 1 << 20)]))
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        else:
            raise BadNpy(f"unsupported .npy version {version}")
    except BadNpy:
        raise
    except Exception as exc:  # numpy raises ValueError and others for bad headers
        raise BadNpy(f"not a valid .npy header: {exc}") from None
    if fortran and len(shape) > 1:
        raise BadNpy("Fortran-order .npy files are not supported; save a C-order array")
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise BadNpy(f"dtype {dtype} cannot be stored (numeric dtypes only)")
    if dtype.type is np.void:
        raise BadNpy(
            f"dtype {dtype} is untyped bytes (numpy.save writes bfloat16 and float8 arrays "
            "so); write the dtype's name as the descr (irdma.npy_header) to store them"
        )
    if any(int(d) < 0 for d in shape):
        raise BadNpy(f"shape {tuple(shape)} has a negative dimension")
    return NpyLayout(dtype, tuple(int(d) for d in shape), f.tell())


MAGIC = b"\x93NUMPY"
VERSIONS = ((1, 0), (2, 0), (3, 0))


def check_start(data: bytes | bytearray | memoryview) -> int | None:
    """Check the start of a .npy file being written, as far as it is there.

    Returns the header's length once the whole header is there and valid,
    None while it is incomplete but right so far; raises BadNpy as soon as
    the bytes there cannot begin a .npy file (so a writer hears it at its
    first write, not only at close).
    """
    head = bytes(data[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise BadNpy(f"not a .npy file: it starts with {head!r}, not the .npy magic {MAGIC!r}")
    if len(data) < len(MAGIC) + 2:
        return None
    version = (data[len(MAGIC)], data[len(MAGIC) + 1])
    if version not in VERSIONS:
        raise BadNpy(f"unsupported .npy version {version[0]}.{version[1]}")
    width = 2 if version == (1, 0) else 4
    start = len(MAGIC) + 2 + width
    if len(data) < start:
        return None
    if len(data) < start + int.from_bytes(bytes(data[start - width : start]), "little"):
        return None
    return parse_header(data).header_len


def parse_npy(data: bytes | bytearray | memoryview, *, zero_fill: bool = False) -> np.ndarray:
    """The array in a complete .npy file (a view of ``data`` where possible).

    ``zero_fill``: data shorter than the header says is the start of the
    array and the rest is zeros, as a sparse file reads (a header-first
    writer such as ``numpy.lib.format.open_memmap`` closes the file after
    the header and fills it later); without it, and always for data longer
    than the header says, the length must match (BadNpy).
    """
    layout = parse_header(data)
    body = memoryview(data)[layout.header_len :]
    if len(body) != layout.nbytes and not (zero_fill and len(body) < layout.nbytes):
        raise BadNpy(
            f".npy header says {layout.nbytes} bytes of data for {layout.dtype} "
            f"{layout.shape}, the file has {len(body)}"
        )
    if len(body) < layout.nbytes:
        full = np.zeros(layout.nbytes, dtype=np.uint8)
        full[: len(body)] = np.frombuffer(body, dtype=np.uint8)
        body = full.data
    return np.frombuffer(body, dtype=layout.dtype).reshape(layout.shape)
