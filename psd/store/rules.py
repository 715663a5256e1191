"""How an update's bytes are applied, and the dtype rules it is checked against.

Pure functions over numpy arrays and tensor metadata: the parameter-server
update rule (``target += alpha * delta``, in three forms that give
bit-identical results), which ``alpha`` may scale a delta of which dtype,
which byte ranges an accumulate or a narrowed wire dtype may cover, and how
many tensor bytes a narrowed payload stands for, and which whole-tensor
write is later than another. Refusals are StoreErrors
naming the problem.
"""

from __future__ import annotations

import math

import numpy as np

from irdma import narrowing
from irdma.dtypes import COMPUTE, is_narrow_float
from irdma.protocol import Status, TensorMeta
from irdma.sizes import ACCUMULATE_PIECE

from ..errors import StoreError


def accumulate_into(target: np.ndarray, delta: np.ndarray, alpha: float) -> None:
    """``target += alpha * delta`` in place, the parameter-server update rule.

    ``delta`` is scratch and is overwritten. The arithmetic is the same as
    ``accumulate_copy`` so both give bit-identical results.
    """
    if is_narrow_float(target.dtype):
        _narrow_update(target, target, delta, alpha)
        return
    scale(delta, alpha)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(target, delta, out=target)


def accumulate_from(target: np.ndarray, source: np.ndarray, alpha: float) -> None:
    """``target += alpha * source`` in place, leaving ``source`` (read-only memory)
    as it is: bit-identical to ``accumulate_into``, in pieces small enough to
    stay in cache, so each byte of ``source`` and ``target`` crosses memory
    once instead of being copied, scaled and added in three passes."""
    if alpha == 1.0 and not is_narrow_float(target.dtype):
        with np.errstate(over="ignore", invalid="ignore"):
            np.add(target, source, out=target)
        return
    step = max(1, ACCUMULATE_PIECE // max(1, source.itemsize))
    scratch = np.empty(min(step, len(source)), dtype=source.dtype)
    for lo in range(0, len(source), step):
        hi = min(lo + step, len(source))
        piece = scratch[: hi - lo]
        np.copyto(piece, source[lo:hi])
        accumulate_into(target[lo:hi], piece, alpha)


def accumulate_copy(target: np.ndarray, delta: np.ndarray, alpha: float) -> None:
    """``delta = target + alpha * delta``: the same update, written into ``delta``."""
    if is_narrow_float(target.dtype):
        _narrow_update(delta, target, delta, alpha)
        return
    scale(delta, alpha)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(target, delta, out=delta)


def scale(delta: np.ndarray, alpha: float) -> None:
    """``delta *= alpha`` in delta's dtype (overflow gives inf, as IEEE arithmetic does)."""
    if alpha == 1.0:
        return
    if is_narrow_float(delta.dtype):
        delta[...] = delta.astype(COMPUTE) * alpha
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if delta.dtype.kind in "iu":
            np.multiply(delta, int(alpha), out=delta, casting="unsafe")
        else:
            np.multiply(delta, alpha, out=delta, casting="same_kind")


def _narrow_update(out: np.ndarray, target: np.ndarray, delta: np.ndarray, alpha: float) -> None:
    """``out = target + alpha * delta`` for bfloat16 or float8: in float32, rounded
    back once (their own arithmetic would round alpha and every step), as a
    narrowed wire's delta is summed at the tensor's precision."""
    wide = delta.astype(COMPUTE)
    with np.errstate(over="ignore", invalid="ignore"):
        if alpha != 1.0:
            np.multiply(wide, alpha, out=wide)
        np.add(wide, target.astype(COMPUTE), out=wide)
        out[...] = wide


def check_alpha(dtype: np.dtype, alpha: float) -> None:
    """Raise StoreError if ``alpha`` cannot scale a delta of ``dtype``."""
    if dtype.kind == "b":
        raise StoreError(Status.DTYPE_MISMATCH, "bool tensors cannot be accumulated")
    if not math.isfinite(alpha):
        raise StoreError(Status.BAD_ARGUMENT, f"alpha {alpha} is not finite")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if alpha != int(alpha) or not info.min <= int(alpha) <= info.max:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"alpha {alpha} must be an integer within {dtype} for an integer tensor",
            )


def check_accumulate(meta: TensorMeta, offset: int, size: int, alpha: float) -> None:
    """Raise StoreError unless bytes ``[offset, offset+size)`` of ``meta`` may be
    accumulated into, scaled by ``alpha``: whole elements of a dtype that adds."""
    dt = meta.np_dtype
    check_alpha(dt, alpha)
    if offset % dt.itemsize or size % dt.itemsize:
        raise StoreError(
            Status.BAD_ARGUMENT,
            f"accumulate range [{offset}, {offset + size}) is not aligned to "
            f"{dt} elements of {dt.itemsize} bytes",
        )


def check_later(meta: TensorMeta, index: int, held: int, stamp: int) -> None:
    """Raise StoreError (STALE_STAMP, naming ``held``) unless whole-tensor write
    ``stamp`` is later than ``held``, the one shard ``index`` holds (0: none).

    Every shard then keeps the later of two whole writes, whatever order they
    arrive in, and the earlier one's writer, refused, writes it again after
    the later one on every shard: the shards end with one write. An equal
    stamp is refused too: a retry of the same request never gets here (its
    txn is known), so it is another write that drew the same stamp.
    """
    if held and stamp <= held:
        raise StoreError(
            Status.STALE_STAMP,
            f"shard {index} of {meta.name!r} holds whole-tensor write {held:#x}, "
            f"not older than this one ({stamp:#x}): stamp the write after it and "
            "write every shard again",
            stamp=held,
        )


def wire_holder(meta: TensorMeta, wire: int, offset: int, size: int) -> np.dtype:
    """The dtype holding bytes ``[offset, offset+size)`` of ``meta`` as they travel as
    ``wire``; StoreError if they may not."""
    dt = meta.np_dtype
    try:
        holder = narrowing.check(dt, wire)
    except ValueError as exc:
        raise StoreError(Status.BAD_ARGUMENT, f"{meta.name!r}: {exc}") from None
    if offset % dt.itemsize or size % dt.itemsize:
        raise StoreError(
            Status.BAD_ARGUMENT,
            f"range [{offset}, {offset + size}) of {meta.name!r} is not whole "
            f"{dt} elements, so it cannot travel as another dtype",
        )
    return holder


def stored_nbytes(meta: TensorMeta, wire: int, wire_nbytes: int) -> int:
    """Tensor bytes of ``wire_nbytes`` bytes of elements in the ``wire`` dtype."""
    holder = wire_holder(meta, wire, 0, 0)
    if wire_nbytes % holder.itemsize:
        raise StoreError(
            Status.BAD_ARGUMENT,
            f"{wire_nbytes} bytes are not whole {narrowing.WIRE_NAMES[wire]} elements",
        )
    return wire_nbytes // holder.itemsize * meta.np_dtype.itemsize


def narrowed(meta: TensorMeta, offset: int, view: np.ndarray, wire: int) -> memoryview:
    """Bytes ``view`` of ``meta`` (at byte ``offset`` of their shard) narrowed to
    ``wire``, as new bytes."""
    wire_holder(meta, wire, offset, len(view))
    return narrowing.narrow(view.view(meta.np_dtype), wire).data
