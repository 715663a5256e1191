"""``irdma put/get/cp/ls/stat/rm`` with the files, names and mistakes users bring."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from irdma import Client
from irdma.names import DIR_MARKER

from .helpers.cluster import Cluster, make_cluster
from .test_cli import irdma


def saved(path: Path, array: np.ndarray) -> str:
    np.save(path, array)
    return str(path)


@pytest.fixture
def weights(cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Two tensors under a prefix of the test's own: PREFIX/fc.weight and PREFIX/fc.bias."""
    prefix = request.node.name.replace("[", "_").replace("]", "")
    with Client(cluster.config_path) as c:
        c.write(f"{prefix}/fc.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
        c.write(f"{prefix}/fc.bias", np.ones(4, np.float16))
    return prefix


def test_get_to_an_unsupported_type_names_the_supported_ones(
    cluster: Cluster, weights: str, tmp_path: Path
) -> None:
    out = tmp_path / "w.bin"
    proc = irdma(cluster, "get", f"{weights}/fc.weight", "-o", str(out), check=False)
    assert proc.returncode == 1
    assert f"{out}: irdma cannot write '.bin' files" in proc.stderr
    for kind in (".npy", ".npz", ".safetensors", "directory", "- (stdin/stdout"):
        assert kind in proc.stderr
    assert not out.exists()


def test_one_tensor_to_each_output_type(cluster: Cluster, weights: str, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    name = f"{weights}/fc.weight"
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    irdma(cluster, "get", name, "-o", str(tmp_path / "w.safetensors"))
    assert list(load_file(str(tmp_path / "w.safetensors"))) == ["fc.weight"]
    assert np.array_equal(load_file(str(tmp_path / "w.safetensors"))["fc.weight"], want)
    irdma(cluster, "get", name, "-o", str(tmp_path / "w.npz"))
    with np.load(tmp_path / "w.npz") as z:
        assert np.array_equal(z["fc.weight"], want)
    (tmp_path / "d").mkdir()
    irdma(cluster, "get", name, "-o", str(tmp_path / "d"))
    assert np.array_equal(np.load(tmp_path / "d" / "fc.weight.npy"), want)
    proc = subprocess.run(
        [sys.executable, "-m", "irdma", "get", name, "-o", "-"],
        capture_output=True,
        env=dict(os.environ, IRDMA_CONFIG=str(cluster.config_path)),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(io.BytesIO(proc.stdout)), want)


def test_get_into_npz_keeps_tensors_named_like_savez_arguments(
    cluster: Cluster, tmp_path: Path
) -> None:
    # np.savez(path, **arrays) took these names for its own arguments: a
    # tensor called allow_pickle was left out of the file, one called file
    # failed the get. An upper-case .NPZ path got ".npz" appended.
    arrays = {
        "allow_pickle": np.arange(3, dtype=np.float32),
        "file": np.ones(2, np.int64),
        "fc.weight": np.zeros((2, 2), np.float16),
    }
    with Client(cluster.config_path) as c:
        for name, array in arrays.items():
            c.write(f"savez_names/{name}", array)
    out = tmp_path / "W.NPZ"
    irdma(cluster, "get", "savez_names/", "-o", str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W.NPZ"]
    with np.load(out) as z:
        assert sorted(z.files) == sorted(arrays)
        for name, array in arrays.items():
            assert z[name].dtype == array.dtype and np.array_equal(z[name], array)


def test_get_a_group_into_a_directory_and_not_into_one_npy(
    cluster: Cluster, weights: str, tmp_path: Path
) -> None:
    proc = irdma(cluster, "get", weights, "-o", str(tmp_path / "back.npy"), check=False)
    assert proc.returncode == 1
    assert "is 2 tensors and a .npy holds one" in proc.stderr
    assert f"-o {weights}.npz" in proc.stderr and "-o DIR/" in proc.stderr
    irdma(cluster, "get", weights, "-o", f"{tmp_path}/out/")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["fc.bias.npy", "fc.weight.npy"]
    assert np.load(tmp_path / "out" / "fc.bias.npy").dtype == np.float16
    # A directory goes back in as the same tensors.
    irdma(cluster, "put", f"{weights}-copy", f"{tmp_path}/out")
    with Client(cluster.config_path) as c:
        assert [i.name for i in c.list(f"{weights}-copy/")] == [
            f"{weights}-copy/fc.bias",
            f"{weights}-copy/fc.weight",
        ]


def test_put_from_stdin_and_several_pairs(cluster: Cluster, tmp_path: Path) -> None:
    a = saved(tmp_path / "a.npy", np.arange(3))
    b = saved(tmp_path / "b.npy", np.zeros((2, 2), np.int8))
    irdma(cluster, "put", "pairs/a", a, "pairs/b", b)
    buf = io.BytesIO()
    np.save(buf, np.full(4, 7, np.uint16))
    subprocess.run(
        [sys.executable, "-m", "irdma", "put", "pairs/stdin", "-"],
        input=buf.getvalue(),
        capture_output=True,
        env=dict(os.environ, IRDMA_CONFIG=str(cluster.config_path)),
        timeout=60,
        check=True,
    )
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("pairs/a"), np.arange(3))
        assert c.read("pairs/b").dtype == np.int8
        assert np.array_equal(c.read("pairs/stdin"), np.full(4, 7, np.uint16))


def test_put_a_text_file_named_npy_names_file_and_cause(cluster: Cluster, tmp_path: Path) -> None:
    fake = tmp_path / "fake.npy"
    fake.write_text("hello, I am text\n")
    proc = irdma(cluster, "put", "x/fake", str(fake), check=False)
    assert proc.returncode == 1
    assert f"{fake}: not a .npy file" in proc.stderr and "numpy.save" in proc.stderr
    assert "pickle" not in proc.stderr
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    proc = irdma(cluster, "put", "x/objects", str(pickled), check=False)
    assert proc.returncode == 1
    assert f"{pickled}: holds Python objects" in proc.stderr and "allow_pickle" not in proc.stderr


def test_put_of_a_file_holding_no_tensors_says_so(cluster: Cluster, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    empty_npz, empty_st = tmp_path / "empty.npz", tmp_path / "empty.safetensors"
    np.savez(empty_npz)  # a zip archive of no files: its end record alone
    save_file({}, str(empty_st))
    for source in (empty_npz, empty_st):
        proc = irdma(cluster, "put", "x/none", str(source), check=False)
        assert proc.returncode == 1
        assert f"{source} holds no tensors; nothing was put" in proc.stderr
    (tmp_path / "nothing").mkdir()
    proc = irdma(cluster, "put", "x/none", f"{tmp_path / 'nothing'}/", check=False)
    assert proc.returncode == 1 and "nothing: no .npy files in this directory" in proc.stderr
    assert irdma(cluster, "ls", "x/", check=False).stdout.count("x/none") == 0


def test_put_with_swapped_arguments_says_so(cluster: Cluster, tmp_path: Path) -> None:
    w = saved(tmp_path / "w.npy", np.zeros(3))
    proc = irdma(cluster, "put", w, "resnet/fc.weight", check=False)
    assert proc.returncode == 2  # a usage error
    assert "tensor name first, then the file" in proc.stderr
    assert f"irdma put resnet/fc.weight {w}" in proc.stderr
    proc = irdma(cluster, "put", "a", w, "b", check=False)
    assert proc.returncode == 2 and "NAME FILE pairs" in proc.stderr


def test_a_layout_clash_names_replace_not_daemons(cluster: Cluster, tmp_path: Path) -> None:
    irdma(cluster, "put", "clash/x", saved(tmp_path / "a.npy", np.zeros(4, np.float32)))
    b = saved(tmp_path / "b.npy", np.zeros(5, np.float64))
    proc = irdma(cluster, "put", "clash/x", b, check=False)
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert line == (
        f"irdma: clash/x is float32 [4] in the cluster and {b} is float64 [5]; "
        "add --replace to redefine it"
    )


def test_a_put_with_one_clash_writes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    with Client(cluster.config_path) as c:
        c.write("whole/c", np.zeros(4, np.float32))
    model = {k: np.full(3, i, np.float32) for i, k in enumerate("abcd")}
    save_file(model, str(tmp_path / "m.safetensors"))
    proc = irdma(cluster, "put", "whole", str(tmp_path / "m.safetensors"), check=False)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines == [
        f"irdma: whole/c is float32 [4] in the cluster and {tmp_path / 'm.safetensors'} (c) "
        "is float32 [3]",
        "irdma: nothing was put: 1 of 4 tensors exist with another dtype or shape; "
        "add --replace to redefine them",
    ]
    with Client(cluster.config_path) as c:
        assert [i.name for i in c.list("whole/")] == ["whole/c"]  # a, b and d not written
        assert np.array_equal(c.read("whole/c"), np.zeros(4, np.float32))
    irdma(cluster, "put", "--replace", "whole", str(tmp_path / "m.safetensors"))
    with Client(cluster.config_path) as c:
        assert {k: c.read(f"whole/{k}").tolist() for k in "abcd"} == {
            k: v.tolist() for k, v in model.items()
        }


def test_a_put_with_a_bad_name_or_a_name_twice_writes_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = saved(tmp_path / "a.npy", np.arange(3))
    np.savez(tmp_path / "m.npz", ok=np.zeros(2), **{"bad/../x": np.ones(2)})
    proc = irdma(cluster, "put", "names/a", a, "names/m", str(tmp_path / "m.npz"), check=False)
    assert proc.returncode == 1
    assert f"{tmp_path / 'm.npz'} (bad/../x): tensor name" in proc.stderr
    assert "nothing was put" in proc.stderr
    proc = irdma(cluster, "put", "names/a", a, "names/a", a, check=False)
    assert proc.returncode == 1
    assert f"names/a would come from both {a} and {a}; nothing was put" in proc.stderr
    assert irdma(cluster, "ls", "names/", check=False).returncode == 1  # nothing there


def test_a_put_that_fails_midway_says_what_was_written(tmp_path: Path) -> None:
    """The daemons run out of room at the second of three tensors."""
    small = make_cluster(tmp_path / "cluster", arena_size=1 << 20)
    try:
        a = saved(tmp_path / "a.npy", np.arange(3))
        big = saved(tmp_path / "big.npy", np.zeros(1 << 20, np.float32))  # 4 MiB > 3 arenas
        c = saved(tmp_path / "c.npy", np.arange(5))
        proc = irdma(small, "put", "mid/a", a, "mid/big", big, "mid/c", c, check=False)
        assert proc.returncode == 1
        [line] = proc.stderr.splitlines()
        assert line.startswith("irdma: put failed at mid/big: ")
        assert line.endswith(
            "; written: mid/a; not written: mid/big (failed), mid/c (1 of 3 put)"
        ), line
        with Client(small.config_path) as client:
            assert [i.name for i in client.list("mid/")] == ["mid/a"]
    finally:
        small.close()


def test_put_name_ending_in_npy_is_stored_without_it(cluster: Cluster, tmp_path: Path) -> None:
    irdma(cluster, "put", "suffix/w.npy", saved(tmp_path / "w.npy", np.arange(5)))
    with Client(cluster.config_path) as c:
        assert [i.name for i in c.list("suffix/")] == ["suffix/w"]


def test_globs_for_ls_get_and_rm(cluster: Cluster, tmp_path: Path) -> None:
    with Client(cluster.config_path) as c:
        for name in ("g/a.weight", "g/a.bias", "g/b.weight", "g/sub/c.weight"):
            c.write(name, np.zeros(2))
    assert irdma(cluster, "ls", "g/*").stdout.split() == ["g/a.bias", "g/a.weight", "g/b.weight"]
    assert irdma(cluster, "ls", "g/**.weight").stdout.split() == [
        "g/a.weight",
        "g/b.weight",
        "g/sub/c.weight",
    ]
    proc = irdma(cluster, "ls", "g/*.nothing", check=False)
    assert proc.returncode == 1 and "no tensor matches 'g/*.nothing'" in proc.stderr
    irdma(cluster, "get", "g/*.weight", "-o", str(tmp_path / "w.npz"))
    with np.load(tmp_path / "w.npz") as z:
        assert sorted(z.files) == ["a.weight", "b.weight"]
    irdma(cluster, "rm", "g/*.bias", "g/sub/c.weight")
    assert irdma(cluster, "ls", "g/").stdout.split() == ["g/a.weight", "g/b.weight"]


def test_stat_and_rm_take_several_names(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        c.write("many/a", np.zeros(3, np.int32))
        c.write("many/b", np.zeros((2, 5), np.float32))
    rows = json.loads(irdma(cluster, "stat", "many/a", "many/b", "--json").stdout)
    assert [(r["name"], r["shape"]) for r in rows] == [("many/a", [3]), ("many/b", [2, 5])]
    proc = irdma(cluster, "rm", "many/a", "many/none", "many/b", check=False)
    assert proc.returncode == 1 and "no tensor named 'many/none'" in proc.stderr
    assert irdma(cluster, "ls", "many/", check=False).returncode == 1  # the others are gone
    with Client(cluster.config_path) as c:
        c.write("many/g/x", np.zeros(1))
    proc = irdma(cluster, "rm", "many/g", check=False)
    assert proc.returncode == 1 and "add -r" in proc.stderr


def test_cp_between_names(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        c.write("cpsrc/w", np.arange(6.0))
        c.write("cpsrc/sub/b", np.ones(2, np.int16))
    irdma(cluster, "cp", "cpsrc/w", "cpdst/w2")
    proc = irdma(cluster, "cp", "cpsrc", "cpall", check=False)
    assert proc.returncode == 1 and "add -r" in proc.stderr
    irdma(cluster, "cp", "-r", "cpsrc", "cpall")
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("cpdst/w2"), np.arange(6.0))
        assert [i.name for i in c.list("cpall/")] == ["cpall/sub/b", "cpall/w"]
        assert c.read("cpall/sub/b").dtype == np.int16
        c.write("cpsrc/w", np.arange(6.0) + 1)  # a copy, not a link
        assert np.array_equal(c.read("cpall/w"), np.arange(6.0))


def test_mv_renames_without_copying(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        c.write("mvsrc/w", np.arange(6.0))
        c.write("mvsrc/sub/b", np.ones(2, np.int16))
        c.write("mvdst/taken", np.zeros(1))
        created = c.stat("mvsrc/w").ctime
    irdma(cluster, "mv", "mvsrc/w", "mvdst/w2")
    proc = irdma(cluster, "mv", "mvdst/w2", "mvdst/taken", check=False)
    assert proc.returncode == 1 and "replace" in proc.stderr
    proc = irdma(cluster, "mv", "mvsrc", "mvall", check=False)
    assert proc.returncode == 1 and "add -r to move" in proc.stderr
    irdma(cluster, "mv", "-r", "mvsrc", "mvall")
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("mvdst/w2"), np.arange(6.0))
        assert c.stat("mvdst/w2").ctime == created  # the same tensor, renamed
        assert [i.name for i in c.list("mvall/")] == ["mvall/sub/b"]
        assert c.list("mvsrc/") == []
    irdma(cluster, "mv", "--replace", "mvdst/w2", "mvdst/taken")
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("mvdst/taken"), np.arange(6.0))


def test_directory_markers_are_hidden_from_ls(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        c.create(f"marked/{DIR_MARKER}", (0,), np.uint8)
        c.create(f"marked/empty/{DIR_MARKER}", (0,), np.uint8)
        c.write("marked/w", np.zeros(2))
    assert irdma(cluster, "ls", "marked/").stdout.split() == ["marked/w"]
    assert f"marked/{DIR_MARKER}" in irdma(cluster, "ls", "-a", "marked/").stdout.split()
    empty = irdma(cluster, "ls", "marked/empty/")  # an empty directory is there: exit 0
    assert empty.stdout == "" and empty.stderr == ""


def test_ls_of_a_name_that_is_not_there_exits_1(cluster: Cluster) -> None:
    """As stat, get and rm do (and aws s3 ls): a script can tell a typo from an empty group."""
    with Client(cluster.config_path) as c:
        c.write("lsnone/w", np.zeros(2))
    proc = irdma(cluster, "ls", "nosuch", check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "irdma: no tensor is named or starts with 'nosuch'\n"
    proc = irdma(cluster, "ls", "lsnone/", "nosuch/", check=False)
    assert proc.returncode == 1 and proc.stdout == "lsnone/w\n"
    assert "'nosuch/'" in proc.stderr


def test_get_without_o_writes_into_the_current_directory(cluster: Cluster, tmp_path: Path) -> None:
    with Client(cluster.config_path) as c:
        c.write("noout/fc.weight", np.arange(6.0).reshape(2, 3))
        c.write("noout/fc.bias", np.ones(3, np.float32))
    env = dict(os.environ, IRDMA_CONFIG=str(cluster.config_path))

    def get(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "irdma", "get", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    one = get("noout/fc.weight")
    assert one.returncode == 0, one.stderr
    assert one.stdout == "fc.weight.npy\n"
    assert np.array_equal(np.load(tmp_path / "fc.weight.npy"), np.arange(6.0).reshape(2, 3))
    group = get("noout")
    assert group.returncode == 0 and group.stdout == "noout.npz\n", group.stderr
    with np.load(tmp_path / "noout.npz") as z:
        assert sorted(z.files) == ["fc.bias", "fc.weight"]
    pattern = get("noout/*.bias")
    assert pattern.returncode == 0 and pattern.stdout == "fc.bias.npy\n", pattern.stderr
    # A file already there is not overwritten without -o naming it.
    (tmp_path / "fc.weight.npy").write_bytes(b"mine")
    again = get("noout/fc.weight")
    assert again.returncode == 1
    assert again.stderr == (
        "irdma: fc.weight.npy exists; to overwrite it, give it as -o fc.weight.npy\n"
    )
    assert (tmp_path / "fc.weight.npy").read_bytes() == b"mine"


def test_ls_lh_lists_human_sizes(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        c.write("lh/w", np.zeros(3 << 10, np.float32))
    proc = irdma(cluster, "ls", "-lh", "lh/")
    assert proc.stdout.split("\t")[:4] == ["lh/w", "float32", "3072", "12.0 KiB"]
    assert "usage" not in proc.stdout
    assert irdma(cluster, "ls", "-l", "lh/").stdout.split("\t")[3] == str(12 << 10)
