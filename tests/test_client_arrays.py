"""The caller's arrays as the client takes them (irdma/client/arrays.py). Pure."""

from __future__ import annotations

import numpy as np
import pytest

from irdma.client.arrays import (
    as_stored_array,
    byte_view,
    check_out,
    delta_array,
    fits,
    narrowed_delta,
)
from irdma.errors import DtypeMismatch, ShapeMismatch
from irdma.narrowing import wire_code
from irdma.protocol import DTYPE_CODES, TensorMeta

M = TensorMeta("a/t", "float32", (2, 3), 4096)


def test_big_endian_and_strided_arrays_become_stored_ones() -> None:
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    arr = as_stored_array(big[:, ::-1])
    assert arr.dtype == np.dtype("<f4") and arr.flags.c_contiguous
    assert np.array_equal(arr, big[:, ::-1])
    assert as_stored_array(np.float32(3)).shape == ()  # a 0-d array stays 0-d
    with pytest.raises(ValueError):
        as_stored_array(np.array(["a"], dtype=object))
    assert len(byte_view(arr)) == 24


def test_out_is_checked_against_the_tensor() -> None:
    check_out(M, np.empty((2, 3), np.float32))
    with pytest.raises(DtypeMismatch, match="a/t"):
        check_out(M, np.empty((2, 3), np.float64))
    with pytest.raises(ShapeMismatch, match="a/t"):
        check_out(M, np.empty(6, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        check_out(M, np.empty((3, 2), np.float32).T)


def test_a_delta_travels_in_the_wire_dtype_chosen_for_it() -> None:
    f16 = wire_code("float16")
    delta = np.full((2, 3), 1.5, np.float32)
    assert narrowed_delta(M, delta_array(delta, 0), 0) is delta
    narrowed = narrowed_delta(M, delta_array(delta, f16), f16)
    assert narrowed.dtype == np.float16 and np.array_equal(narrowed, delta)
    # Already narrowed by the caller: taken as it is.
    held = np.full((2, 3), 2.0, np.float16)
    assert delta_array(held, f16) is held
    assert narrowed_delta(M, held, f16).dtype == np.float16
    with pytest.raises(ShapeMismatch):
        narrowed_delta(M, np.zeros(6, np.float16), f16)
    with pytest.raises(DtypeMismatch):
        narrowed_delta(M, np.zeros((2, 3), np.float64), 0)


def test_a_stored_array_fits_a_tensor_of_its_dtype_name_and_shape() -> None:
    # write checked a cached layout by dtype, write_many by dtype name: one
    # check (fits) serves both because a stored array's dtype is little-endian.
    metas = [TensorMeta("a/t", name, (3,), 4096) for name in DTYPE_CODES]
    for name in DTYPE_CODES:
        for order in "<>=":
            arr = as_stored_array(np.zeros(3, np.dtype(name).newbyteorder(order)))
            for m in metas:
                assert fits(m, arr.dtype, arr.shape) == (m.dtype == arr.dtype.name)
                assert not fits(m, arr.dtype, (4,))
