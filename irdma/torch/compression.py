"""Gradient compression on the wire: what a worker sends and how it is summed.

- ``NONE``: the gradient as it is (float32; float64 and float16 stay so);
  the daemon sums the workers' contributions in rank order.
- ``FP16`` and ``BF16``: each contribution is rounded to float16 (or
  bfloat16) on the way to the daemon, which widens it and sums in float32
  in rank order (``irdma.narrowing``); the sum comes back rounded to the
  same narrow dtype. Half the bytes on every link, both ways, and no
  precision lost while summing. When averaging, each contribution is divided
  by the world size before the sum, so the rounded sum stays in float16's
  range (fp16: cast, then divided, exactly as torch's ``fp16_compress_hook``;
  bf16: divided, then rounded).
- ``Compression.topk(ratio)``: only the largest ``ratio`` of each tensor's
  elements (by magnitude) as index/value pairs, gathered from every worker
  and summed in float32 in rank order; with error feedback (the default)
  what was not sent is added to the next step's gradient.

Every worker computes the same result bit for bit: sums go in rank order.
Encoding and selection run on the gradient's device (a GPU's, for a CUDA
model), so only the compressed bytes cross to the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .arrays import to_numpy

KINDS = ("none", "fp16", "bf16", "topk")
# Dtypes the daemon stores and sums uncompressed gradients in.
_DENSE_SUM = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}
# The wire dtype (irdma.narrowing) of each narrowing compression.
WIRE = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True, slots=True)
class Compression:
    """How one tensor's gradient goes on the wire (see the module docstring)."""

    kind: str = "none"
    ratio: float = 1.0  # topk: the fraction of each tensor's elements sent
    error_feedback: bool = True  # topk: carry what was not sent into the next step

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown compression {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind == "topk":
            if not (isinstance(self.ratio, int | float) and 0 < self.ratio <= 1):
                raise ValueError(f"top-k ratio must be in (0, 1], not {self.ratio!r}")
        elif self.ratio != 1.0 or not self.error_feedback:
            raise ValueError(f"ratio and error_feedback only apply to topk, not {self.kind}")

    @classmethod
    def none(cls) -> Compression:
        return NONE

    @classmethod
    def fp16(cls) -> Compression:
        return FP16

    @classmethod
    def bf16(cls) -> Compression:
        return BF16

    @classmethod
    def topk(cls, ratio: float, *, error_feedback: bool = True) -> Compression:
        return cls("topk", ratio, error_feedback)

    @classmethod
    def parse(cls, text: str) -> Compression:
        """``none``, ``fp16``, ``bf16`` or ``topk:0.01``, as the examples take it."""
        kind, _, arg = text.partition(":")
        if kind == "topk":
            return cls.topk(float(arg) if arg else 0.01)
        if arg:
            raise ValueError(f"compression {kind!r} takes no argument")
        return cls(kind)

    @property
    def summed_on_daemon(self) -> bool:
        """Whether the daemon adds the contributions (else workers gather and add them)."""
        return self.kind != "topk"

    @property
    def wire(self) -> str | None:
        """The wire dtype the client sends and receives the sums in (None: as stored)."""
        return WIRE.get(self.kind)

    def describe(self) -> str:
        return f"topk:{self.ratio:g}" if self.kind == "topk" else self.kind


NONE = Compression()
FP16 = Compression("fp16")
BF16 = Compression("bf16")


# -- dense sums (the daemon adds) -----------------------------------------------------


def dense_sum_dtype(c: Compression, dtype: torch.dtype) -> np.dtype:
    """The dtype the daemon holds and sums a gradient of ``dtype`` in."""
    if c.wire is not None:
        return np.dtype(np.float32)  # narrowed on the wire, summed in float32
    # bfloat16, float8 and other narrow types: summed in float32, so nothing is lost
    # (their own arithmetic would round at every add).
    return np.dtype(_DENSE_SUM.get(dtype, np.float32))


def encode_dense(
    c: Compression, flat: torch.Tensor, world_size: int, average: bool
) -> torch.Tensor:
    """A 1-d gradient as this worker's contribution to the daemon's sum, in the
    wire's dtype, on the gradient's device."""
    if c.kind == "fp16":
        t = flat.detach().to(torch.float16, copy=True)
        if average:
            # Before the sum, exactly as torch's fp16_compress_hook (cast, then divide).
            t.div_(world_size)
        return t
    if c.kind == "bf16":
        t = flat.detach()
        return (t.to(torch.float32) / world_size if average else t).to(torch.bfloat16)
    # No copy for a float32 gradient: the client sends its bytes as they are.
    wire = dense_sum_dtype(c, flat.dtype)
    return flat.detach().to(_torch_dtype(wire)).contiguous()


def decode_dense(
    c: Compression,
    total: np.ndarray,
    world_size: int,
    average: bool,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The daemon's sum (a fresh array, widened by the client) as the reduced 1-d
    gradient, on ``device`` (default: the CPU, sharing ``total``'s memory)."""
    t = torch.from_numpy(total)
    if device is not None and device.type != "cpu":
        t = t.to(device, non_blocking=True)
    if c.wire is not None:
        return t  # averaged before the sum already
    return t.div_(world_size) if average else t


def wire_nbytes(c: Compression, total: np.ndarray) -> int:
    """Bytes a sum of ``total``'s size took on the wire."""
    return total.size * 2 if c.wire is not None else total.nbytes


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    return {np.float16: torch.float16, np.float32: torch.float32, np.float64: torch.float64}[
        dt.type
    ]


# -- bfloat16 as uint16 bits ------------------------------------------------------------


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    """The bfloat16 rounding of ``t`` (round to nearest even) as uint16 bit patterns."""
    return to_numpy(t.detach().reshape(-1).to(torch.bfloat16)).view(np.uint16)


# -- top-k with error feedback -------------------------------------------------------------


def topk_count(ratio: float, n: int) -> int:
    """How many of ``n`` elements top-k sends (at least one of a non-empty tensor)."""
    return 0 if n == 0 else min(n, max(1, math.ceil(ratio * n)))


class TopK:
    """Top-k selection with per-tensor residuals (error feedback), keyed by tensor."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def select(self, key: str, c: Compression, flat: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The int32 indices and float32 values this worker sends for a 1-d gradient."""
        g = flat.detach().to(torch.float32)
        if c.error_feedback:
            residual = self.residuals.get(key)
            if residual is not None:
                if residual.shape != g.shape:
                    raise ValueError(f"top-k tensor {key!r} changed size: {residual.shape}")
                g = g + residual
            else:
                g = g.clone()
        k = topk_count(c.ratio, g.numel())
        idx = torch.topk(g.abs(), k, sorted=False).indices
        values = g[idx]
        if c.error_feedback:
            g[idx] = 0.0
            self.residuals[key] = g  # what was not sent this step
        # Chosen on the gradient's device; only the pairs come to the host.
        return idx.to(torch.int32).cpu().numpy(), values.cpu().numpy()


def pack_pairs(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Index/value pairs of several tensors as one int32 array (values by their bits)."""
    chunks: list[np.ndarray] = []
    for idx, values in parts:
        chunks += [idx.astype(np.int32, copy=False), values.astype(np.float32).view(np.int32)]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int32)


def unpack_pairs(row: np.ndarray, counts: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The inverse of ``pack_pairs`` for tensors sending ``counts`` pairs each."""
    out = []
    at = 0
    for k in counts:
        idx = row[at : at + k]
        values = row[at + k : at + 2 * k].view(np.float32)
        out.append((idx, values))
        at += 2 * k
    return out


def sum_pairs(
    rows: list[tuple[np.ndarray, np.ndarray]], n: int, device: torch.device | None = None
) -> torch.Tensor:
    """The dense float32 sum of every worker's pairs, added in rank order (on ``device``)."""
    total = torch.zeros(n, dtype=torch.float32, device=device)
    for idx, values in rows:
        # Indices are distinct within one worker's pairs, so this is one add per element.
        at = torch.from_numpy(idx.astype(np.int64)).to(total.device)
        total[at] += torch.from_numpy(values.copy()).to(total.device)
    return total
