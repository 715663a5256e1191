"""torch tensors as numpy arrays and back, bfloat16 and float8 included.

``Tensor.numpy()`` and ``torch.from_numpy`` know no bfloat16 or float8;
numpy has them through ml_dtypes (``irdma.dtypes``). Both sides are then
viewed as an integer of the same width, so the bits cross unchanged and
without a copy.
"""

from __future__ import annotations

import numpy as np
import torch

from irdma.dtypes import BFLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2

# torch dtype -> (its numpy twin, the same-width integer both sides view as).
_VIEWED: dict[torch.dtype, tuple[np.dtype, torch.dtype]] = {torch.bfloat16: (BFLOAT16, torch.int16)}
for _name, _np in (("float8_e4m3fn", FLOAT8_E4M3FN), ("float8_e5m2", FLOAT8_E5M2)):
    if hasattr(torch, _name):  # torch 2.1 and later
        _VIEWED[getattr(torch, _name)] = (_np, torch.uint8)
_BY_NUMPY = {np_dt: (t_dt, via) for t_dt, (np_dt, via) in _VIEWED.items()}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of torch ``dtype`` (bfloat16 and float8 through ml_dtypes)."""
    viewed = _VIEWED.get(dtype)
    if viewed is not None:
        return viewed[0]
    return torch.empty(0, dtype=dtype).numpy().dtype


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` (detached, on the CPU, C-contiguous) as a numpy array of the same dtype and shape."""
    t = t.detach().cpu().contiguous()
    viewed = _VIEWED.get(t.dtype)
    if viewed is None:
        return t.numpy()
    np_dt, via = viewed
    return t.view(via).numpy().view(np_dt)


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory, of the same dtype and shape."""
    viewed = _BY_NUMPY.get(a.dtype)
    if viewed is None:
        return torch.from_numpy(a)
    t_dt, via = viewed
    ints = a.view(np.int16 if via == torch.int16 else np.uint8)
    return torch.from_numpy(ints).view(t_dt)
