"""``irdma versions`` and ``irdma get NAME@V``, run as a user would, against real daemons."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from irdma import Client

from .helpers.cluster import Cluster
from .test_cli import irdma


def test_versions_lists_and_get_fetches_one(cluster: Cluster, tmp_path: Path) -> None:
    with Client(cluster.config_path) as c:
        model = c.model("clim/policy", keep=2)
        for k in range(3):
            model.commit(
                {"fc.weight": np.full((4, 5), k, np.float32), "enc/b": np.arange(3) + k},
                extra={"step": k},
            )
    rows = json.loads(irdma(cluster, "versions", "clim/policy", "--json").stdout)
    assert [r["version"] for r in rows] == [2, 3]  # the last two kept
    assert rows[-1]["tensors"] == 2 and rows[-1]["bytes"] == 80 + 24
    assert rows[-1]["extra"] == {"step": 2}
    assert [r["pins"] for r in rows] == [0, 0]
    with Client(cluster.config_path) as c, c.model("clim/policy").pin(2):
        rows = json.loads(irdma(cluster, "versions", "clim/policy", "--json").stdout)
        assert [r["pins"] for r in rows] == [1, 0]
    table = irdma(cluster, "versions", "clim/policy").stdout.splitlines()
    assert table[0].split() == ["VERSION", "COMMITTED", "TENSORS", "SIZE", "WRITERS", "PINS"]
    assert [line.split()[0] for line in table[1:]] == ["2", "3"]
    # A whole version, the latest, and one tensor of a given version.
    irdma(cluster, "get", "clim/policy@2", "-o", str(tmp_path / "v2.npz"))
    with np.load(tmp_path / "v2.npz") as z:
        assert sorted(z.files) == ["enc/b", "fc.weight"] and (z["fc.weight"] == 1).all()
    irdma(cluster, "get", "clim/policy@latest", "-o", str(tmp_path / "d") + "/")
    assert (np.load(tmp_path / "d" / "enc" / "b.npy") == np.arange(3) + 2).all()
    irdma(cluster, "get", "clim/policy/fc.weight@2", "-o", str(tmp_path / "w.npy"))
    assert (np.load(tmp_path / "w.npy") == 1).all()
    # Without -o: named after the model and the version, in the current directory.
    out = irdma(cluster, "get", "clim/policy@3", cwd=tmp_path)
    assert out.stdout.strip() == "policy@3.npz"
    with np.load(tmp_path / "policy@3.npz") as z:
        assert (z["fc.weight"] == 2).all()
    # Never over an existing file.
    again = irdma(cluster, "get", "clim/policy@3", cwd=tmp_path, check=False)
    assert again.returncode != 0 and "policy@3.npz exists" in again.stderr


@pytest.fixture(scope="module")
def three_versions(cluster: Cluster) -> str:
    """Model ``clim/errs`` with versions 2 and 3 kept (1 pruned)."""
    with Client(cluster.config_path) as c:
        model = c.model("clim/errs", keep=2)
        for _ in range(3):
            model.commit({"fc.weight": np.zeros((4, 5), np.float32)})
    return "clim/errs"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("clim/errs@1", "version 1 of 'clim/errs' was pruned"),
        ("clim/errs@9", "version 9 of 'clim/errs' is not committed"),
        ("clim/nothing@1", "no model with versions at 'clim/nothing'"),
        ("clim/errs/nope@3", "tensor 'nope' is not in version 3"),
    ],
)
def test_get_of_a_version_that_is_not_there_says_why(
    cluster: Cluster, three_versions: str, tmp_path: Path, name: str, message: str
) -> None:
    proc = irdma(cluster, "get", name, "-o", str(tmp_path / "x.npz"), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "x.npz").exists()


def test_status_shows_each_model_its_latest_version_and_readers_lag(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        model = c.model("cstat/policy", keep=4)
        for k in range(3):
            model.commit({"w": np.full(4, k, np.float32)})
        with model.pin(2):
            out = irdma(cluster, "status").stdout.splitlines()
            rows = json.loads(irdma(cluster, "status", "--json").stdout)
    heading = next(i for i, line in enumerate(out) if line.startswith("MODEL"))
    assert out[heading].split() == ["MODEL", "LATEST", "OLDEST", "PINNED", "LAG"]
    line = next(line for line in out[heading:] if line.startswith("cstat/policy "))
    assert line.split() == ["cstat/policy", "3", "2", "1"]
    # Each daemon's own figures: those holding the model's manifests or pins say so.
    held = [m for r in rows for m in r["models"] if m["model"] == "cstat/policy"]
    assert held and max(m["newest"] for m in held) == 3
    assert min(m["oldest_pinned"] for m in held if m["oldest_pinned"]) == 2
