"""irdma.torch's weight sync over model versions against real daemons: a trainer
publishes a bf16 module each step; followers (whole, and a tensor-parallel
half) load each version bit-exact, moving only what changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from irdma import Client
from irdma.torch import StateFollower, publish_state_dict

from .helpers.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent


def bf16_model(seed: int, rows: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(300, rows), nn.ReLU(), nn.Linear(rows, 10)).to(torch.bfloat16)


def step(master: nn.Module, published: nn.Module) -> None:
    """One AdamW step at an RL-like learning rate on fp32 master weights, then the
    bf16 copy published: most of its elements stay bit-identical."""
    opt = torch.optim.AdamW(master.parameters(), lr=1e-5)
    loss = master(torch.randn(32, 300)).square().mean()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for dst, src in zip(published.parameters(), master.parameters(), strict=True):
            dst.copy_(src.to(torch.bfloat16))


def same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_follower_loads_each_version_bit_exact_moving_only_changes(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        published = bf16_model(0)
        master = bf16_model(0).float()
        assert publish_state_dict(c, "tv/policy", published) == 1
        follower_module = bf16_model(1)
        follower = StateFollower(c, "tv/policy", follower_module)
        assert follower.sync() == 1 and same(follower_module, published)
        full = sum(t.numel() * t.element_size() for t in published.state_dict().values())
        assert follower.last_bytes == full
        for v in (2, 3):
            step(master, published)
            assert publish_state_dict(c, "tv/policy", published) == v
            assert follower.sync() == v
            assert same(follower_module, published)
            assert 0 < follower.last_bytes < full / 2, (follower.last_bytes, full)
            # The follower pins the version it holds, and only that one.
            pins = [i.name for i in c.list("tv/policy/@pins/")]
            assert len(pins) == 1 and pins[0].startswith(f"tv/policy/@pins/{v}/")
        follower.close()
        assert c.list("tv/policy/@pins/") == []


def test_a_tensor_parallel_follower_moves_only_its_half(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        published = bf16_model(2)
        master = bf16_model(2).float()
        publish_state_dict(c, "tv/tp", published)
        half = bf16_model(3, rows=32)  # rank 1 of 2: the second half of layer 0's rows
        rows = (slice(32, 64),)
        slices = {"0.weight": rows, "0.bias": rows, "2.weight": (slice(None), slice(32, 64))}
        keep = {"2.bias"}  # replicated on every rank: read whole
        assert keep | set(slices) == set(published.state_dict())
        follower = StateFollower(c, "tv/tp", half, slices=slices)
        for v in (1, 2):
            if v == 2:
                step(master, published)
                publish_state_dict(c, "tv/tp", published)
            assert follower.sync() == v
            whole, part = published.state_dict(), half.state_dict()
            assert torch.equal(part["0.weight"], whole["0.weight"][32:64])
            assert torch.equal(part["0.bias"], whole["0.bias"][32:64])
            assert torch.equal(part["2.weight"], whole["2.weight"][:, 32:64])
            assert torch.equal(part["2.bias"], whole["2.bias"])
        mine = sum(t.numel() * t.element_size() for t in half.state_dict().values())
        assert follower.last_bytes < mine


def test_the_weight_sync_example_runs_as_a_user_runs_it(cluster: Cluster, tmp_path: Path) -> None:
    """examples/weight_sync.py at a small size: followers in their own layouts, the
    figures for readers 1, 3 and 8 versions behind, and the Gloo broadcast beside."""
    argv = [sys.executable, str(ROOT / "examples" / "weight_sync.py")]
    argv += ["--layers", "2", "--width", "64", "--steps", "9", "--rounds", "1"]
    argv += ["--json", str(tmp_path / "figures.json")]
    env = dict(os.environ, IRDMA_CONFIG=str(cluster.config_path))
    run = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.count("follower (") == 3
    figures = json.loads((tmp_path / "figures.json").read_text())
    rows = {r["behind"]: r for r in figures["rows"]}
    assert sorted(rows) == [1, 3, 8]
    # Only what changed moves, and more the further behind a reader is.
    assert 0 < rows[1]["fraction"] <= rows[3]["fraction"] <= rows[8]["fraction"] < 1
    assert figures["gloo_broadcast_s"] > 0
