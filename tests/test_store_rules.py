"""Tests for irdma_psd.store.rules: the update rule's forms and the dtype rules
an update is checked against. Plain numpy, no daemon."""

from __future__ import annotations

import numpy as np
import pytest
from irdma_psd.store import StoreError
from irdma_psd.store.rules import (
    accumulate_copy,
    accumulate_into,
    check_accumulate,
    narrowed,
    scale,
    stored_nbytes,
    wire_holder,
)

from irdma import narrowing
from irdma.protocol import Status, TensorMeta

F16 = narrowing.wire_code("float16")


def meta(dtype: str = "float32", n: int = 1024) -> TensorMeta:
    return TensorMeta("r/t", dtype, (n,), 4096)


def test_scale_multiplies_in_the_deltas_own_dtype() -> None:
    ints = np.array([1, -2, 3], dtype=np.int32)
    scale(ints, -3.0)
    assert ints.tolist() == [-3, 6, -9] and ints.dtype == np.int32
    floats = np.array([1.5, 2.0], dtype=np.float32)
    scale(floats, 1.0)  # alpha 1 leaves the delta as it is
    assert floats.tolist() == [1.5, 2.0]


def test_into_and_copy_give_the_same_sum() -> None:
    rng = np.random.default_rng(7)
    target = rng.standard_normal(100).astype(np.float32)
    delta = rng.standard_normal(100).astype(np.float32)
    in_place, copied = target.copy(), delta.copy()
    accumulate_into(in_place, delta.copy(), 0.25)
    accumulate_copy(target, copied, 0.25)
    assert in_place.tobytes() == copied.tobytes()


def test_accumulate_must_cover_whole_elements() -> None:
    check_accumulate(meta(), 8, 16, 2.0)
    with pytest.raises(StoreError, match="not aligned to float32") as ei:
        check_accumulate(meta(), 2, 16, 1.0)
    assert ei.value.status == Status.BAD_ARGUMENT
    with pytest.raises(StoreError, match="not finite"):
        check_accumulate(meta(), 0, 16, float("nan"))
    with pytest.raises(StoreError, match="cannot be accumulated") as ei:
        check_accumulate(meta("bool"), 0, 16, 1.0)
    assert ei.value.status == Status.DTYPE_MISMATCH


def test_wire_holder_names_the_dtype_the_wire_holds() -> None:
    assert wire_holder(meta(), F16, 0, 64) == np.dtype("<f2")
    with pytest.raises(StoreError, match="not whole float32 elements"):
        wire_holder(meta(), F16, 1, 64)
    with pytest.raises(StoreError, match="'r/t'") as ei:
        wire_holder(meta("int32"), F16, 0, 64)  # a wire dtype stands only for floats
    assert ei.value.status == Status.BAD_ARGUMENT


def test_stored_nbytes_counts_tensor_bytes_of_wire_bytes() -> None:
    assert stored_nbytes(meta(), F16, 64) == 128
    with pytest.raises(StoreError, match="not whole float16 elements"):
        stored_nbytes(meta(), F16, 63)


def test_narrowed_gives_the_wire_form_of_a_read() -> None:
    values = np.array([1.0, -2.5, 3.25, 0.5], dtype=np.float32)
    out = narrowed(meta(), 0, values.view(np.uint8), F16)
    assert np.frombuffer(out, dtype=np.float16).tolist() == [1.0, -2.5, 3.25, 0.5]
    with pytest.raises(StoreError, match="not whole"):
        narrowed(meta(), 2, values.view(np.uint8)[:6], F16)
