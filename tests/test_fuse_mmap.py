"""Readers that map files: np.load(mmap_mode="r"), safetensors, np.memmap, on the mount."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from irdma import Client

from .helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


@pytest.mark.parametrize("n", [1000, 10 * MIB // 4], ids=["small", "several-chunks"])
def test_np_load_mmap(mount: Path, n: int) -> None:
    d = mount / f"mm-{n}"
    d.mkdir()
    x = np.random.default_rng(n).random(n, dtype=np.float32)
    np.save(d / "x.npy", x)
    m = np.load(d / "x.npy", mmap_mode="r")
    try:
        assert np.array_equal(m, x)
        assert np.array_equal(m[n // 2 : n // 2 + 7], x[n // 2 : n // 2 + 7])
    finally:
        del m


def test_safetensors_on_the_mount(cluster: Cluster, mount: Path) -> None:
    d = mount / "st"
    d.mkdir()
    rng = np.random.default_rng(5)
    tensors = {
        "embed": rng.standard_normal((1024, 768)).astype(np.float32),  # 3 MiB
        "bias": np.arange(768, dtype=np.float16),
        "ids": np.arange(10, dtype=np.int64),
    }
    save_file(tensors, str(d / "model.safetensors"), metadata={"step": "7"})
    with safe_open(str(d / "model.safetensors"), framework="np") as f:  # maps the file
        assert sorted(f.keys()) == sorted(tensors)
        assert f.metadata() == {"step": "7"}
        for k, v in tensors.items():
            assert np.array_equal(f.get_tensor(k), v)
        part = f.get_slice("embed")[10:20]
        assert np.array_equal(part, tensors["embed"][10:20])
    back = load_file(str(d / "model.safetensors"))
    assert all(np.array_equal(back[k], v) for k, v in tensors.items())
    with Client(cluster.config_path) as c:  # stored as a raw file
        assert c.stat("st/model.safetensors").dtype == "uint8"


def test_memmap_rewrite_of_a_large_file_in_place(cluster: Cluster, mount: Path) -> None:
    d = mount / "mm-rw"
    d.mkdir()
    n = 10 * MIB // 4
    x = np.zeros(n, np.float32)
    np.save(d / "x.npy", x)
    m = np.memmap(d / "x.npy", dtype=np.float32, mode="r+", offset=128, shape=(n,))
    m[::4096] = 1.5
    m.flush()  # msync: the mount pushes what changed
    del m
    x[::4096] = 1.5
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("mm-rw/x"), x)
    assert os.stat(d / "x.npy").st_size == 128 + 4 * n
