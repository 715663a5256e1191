"""Tests for irdma.cluster: TOML config parsing and rendezvous placement."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from irdma.cli.local import write_config
from irdma.cluster import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_SHARD_SIZE,
    DEFAULT_TIMEOUT,
    Address,
    ClusterConfig,
    ConfigInForce,
    find_config_path,
    load_config,
    parse_config,
    parse_size,
    render_config,
    rendezvous_order,
)
from irdma.cluster.epochs import Epoch
from irdma.errors import ConfigError, IrdmaError
from irdma.protocol import tensor_key

# -- parse_size --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("4MiB", 4 << 20),
        ("4mib", 4 << 20),
        ("1 GiB", 1 << 30),
        ("  8 KiB  ", 8 << 10),
        ("512k", 512 << 10),
        ("512K", 512 << 10),
        ("3m", 3 << 20),
        ("2g", 2 << 30),
        ("1TiB", 1 << 40),
        ("2mb", 2_000_000),
        ("5kb", 5000),
        ("1GB", 10**9),
        ("1tb", 10**12),
        ("1.5KiB", 1536),
        ("0.5MiB", 512 << 10),
        ("100b", 100),
        ("100B", 100),
    ],
)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        -1,
        True,
        False,
        1.5,
        None,
        [],
        "",
        "MiB",
        "4XB",
        "4 Mi B",
        "-4k",
        "4MiB4",
        "1e6",
        "0x10",
        "4,096",
    ],
)
def test_parse_size_errors(value: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(value)


# -- Address -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("tcp://127.0.0.1:7401", "127.0.0.1", 7401),
        ("127.0.0.1:7401", "127.0.0.1", 7401),
        ("localhost:1", "localhost", 1),
        ("tcp://node-3.example.org:65535", "node-3.example.org", 65535),
        ("tcp://[::1]:7401", "::1", 7401),
        ("[fe80::1:2]:9", "fe80::1:2", 9),
        ("[::ffff:10.0.0.1]:80", "::ffff:10.0.0.1", 80),
    ],
)
def test_address_parse(text: str, host: str, port: int) -> None:
    a = Address.parse(text)
    assert a == Address("tcp", host, port)
    # str() is canonical and parses back to the same address.
    assert str(a).startswith("tcp://")
    assert Address.parse(str(a)) == a


def test_address_schemes() -> None:
    for scheme in ("tcp", "shm", "rdma"):
        a = Address.parse(f"{scheme}://198.18.0.1:7401")
        assert (a.scheme, a.host, a.port) == (scheme, "198.18.0.1", 7401)
        assert Address.parse(str(a)) == a


def test_rdma_options(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, "rdma_gid_index = 1\nrdma_mtu = 4096\n" + nodes_toml(node(1)))
    )
    assert (cfg.rdma_gid_index, cfg.rdma_mtu) == (1, 4096)
    cfg = load_config(write(tmp_path, nodes_toml(node(1))))
    assert (cfg.rdma_gid_index, cfg.rdma_mtu) == (None, None)


def test_address_str_brackets_ipv6() -> None:
    assert str(Address.parse("[::1]:7401")) == "tcp://[::1]:7401"
    assert str(Address.parse("h:7")) == "tcp://h:7"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("udp://127.0.0.1:7401", "unknown transport"),
        ("ib://h:1", "unknown transport"),
        ("h:0", "port out of range"),
        ("h:65536", "port out of range"),
        ("h:99999", "port out of range"),
        ("h", "not of the form"),
        ("tcp://h", "not of the form"),
        ("h:", "not of the form"),
        ("h:port", "not of the form"),
        ("h:-1", "not of the form"),
        ("::1:7401", "not of the form"),
        ("[::1]", "not of the form"),
        ("tcp://h:1/path", "not of the form"),
        ("tcp:/h:1", "not of the form"),
        ("", "not of the form"),
    ],
)
def test_address_parse_errors(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Address.parse(text)


# -- load_config -------------------------------------------------------------

VALID = """
shard_size = "64KiB"
replicas = 2
timeout = 2.5
secret_file = "/etc/irdma/secret"

[[nodes]]
name = "n1"
address = "tcp://127.0.0.1:7401"
data_dir = "/var/lib/irdma/n1"
arena_size = "1GiB"

[[nodes]]
name = "n2"
address = "[::1]:7402"
arena_size = 2097152
"""


def write(tmp_path: Path, text: str, name: str = "cluster.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def nodes_toml(*nodes: dict[str, object]) -> str:
    out = []
    for n in nodes:
        out.append("[[nodes]]")
        for k, v in n.items():
            out.append(f"{k} = {v!r}".replace("'", '"'))
        out.append("")
    return "\n".join(out)


def node(i: int, **changes: object) -> dict[str, object]:
    return {"name": f"n{i}", "address": f"tcp://10.0.0.{i}:7401", "arena_size": "64MiB"} | changes


def test_load_valid_config(tmp_path: Path) -> None:
    p = write(tmp_path, VALID)
    cfg = load_config(p)
    assert isinstance(cfg, ClusterConfig)
    assert cfg.path == p
    assert cfg.shard_size == 64 << 10
    assert cfg.replicas == 2
    assert cfg.timeout == 2.5
    assert isinstance(cfg.timeout, float)
    assert cfg.secret_file == Path("/etc/irdma/secret")
    assert [n.name for n in cfg.nodes] == ["n1", "n2"]
    n1, n2 = cfg.nodes
    assert n1.address == Address("tcp", "127.0.0.1", 7401)
    assert n1.data_dir == Path("/var/lib/irdma/n1")
    assert n1.arena_size == 1 << 30
    assert n2.address == Address("tcp", "::1", 7402)
    assert n2.data_dir == Path("/var/lib/irdma/n2")  # default
    assert n2.arena_size == 2 << 20
    assert cfg.node("n2") is n2
    # load_config accepts a str as well as a Path.
    assert load_config(str(p)).nodes == cfg.nodes


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, nodes_toml(node(1))))
    assert cfg.shard_size == DEFAULT_SHARD_SIZE
    assert cfg.replicas == 1
    assert cfg.timeout == DEFAULT_TIMEOUT
    assert cfg.secret_file is None
    assert cfg.lend_forwards is True


def test_unknown_node_name(tmp_path: Path) -> None:
    p = write(tmp_path, VALID)
    cfg = load_config(p)
    with pytest.raises(ConfigError, match="no node named 'n9'") as ei:
        cfg.node("n9")
    assert str(p) in str(ei.value)
    assert "n1, n2" in str(ei.value)


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ")
    assert "not found" in msg
    assert isinstance(ei.value, IrdmaError)


def test_unreadable_path_is_config_error(tmp_path: Path) -> None:
    d = tmp_path / "dir.toml"
    d.mkdir()
    with pytest.raises(ConfigError, match="cannot read config") as ei:
        load_config(d)
    assert str(d) in str(ei.value)


@pytest.mark.parametrize(
    "text",
    [b"shard_size = = 1\n", b"[[nodes]\nname = 'x'\n", b'name = "\xff\xfe"\n', b"a = 1\na = 2\n"],
)
def test_invalid_toml(tmp_path: Path, text: bytes) -> None:
    p = tmp_path / "bad.toml"
    p.write_bytes(text)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ")
    assert "not valid TOML" in msg


NAN = float("nan")

# (TOML text, key named in the message, words of the problem)
BAD_CONFIGS = [
    ("bogus = 1\n" + nodes_toml(node(1)), "bogus", "unknown key"),
    (nodes_toml(node(1, colour="red")), "nodes[0].colour", "unknown key"),
    ("replicas = 1\n", "nodes", "at least one [[nodes]]"),
    ("nodes = []\n", "nodes", "at least one [[nodes]]"),
    ('nodes = "n1"\n', "nodes", "at least one [[nodes]]"),
    ("nodes = [1]\n", "nodes[0]", "must be a table"),
    (nodes_toml({"name": "n1", "arena_size": "64MiB"}), "nodes[0].address", "missing"),
    (nodes_toml({"address": "h:1", "arena_size": "64MiB"}), "nodes[0].name", "missing"),
    (nodes_toml({"name": "n1", "address": "h:1"}), "nodes[0].arena_size", "missing"),
    (nodes_toml(node(1, name="bad name")), "nodes[0].name", "letters, digits"),
    (nodes_toml(node(1, name="")), "nodes[0].name", "letters, digits"),
    (nodes_toml(node(1, name="x" * 65)), "nodes[0].name", "letters, digits"),
    (nodes_toml(node(1), node(2, name="n1")), "nodes[1].name", "duplicate node name 'n1'"),
    (
        nodes_toml(node(1), node(2), node(3, address="10.0.0.2:7401")),
        "nodes[2].address",
        "used by another node",
    ),
    (nodes_toml(node(1, address="udp://h:1")), "nodes[0].address", "unknown transport"),
    (nodes_toml(node(1, address="h:70000")), "nodes[0].address", "port out of range"),
    (
        nodes_toml(node(1), node(2, arena_size="512KiB")),
        "nodes[1].arena_size",
        "under the 1 MiB minimum",
    ),
    (nodes_toml(node(1), node(2, arena_size=0)), "nodes[1].arena_size", "under the 1 MiB"),
    (nodes_toml(node(1), node(2, arena_size="lots")), "nodes[1].arena_size", "expected a size"),
    (nodes_toml(node(1), node(2, arena_size=-5)), "nodes[1].arena_size", "negative"),
    (nodes_toml(node(1, data_dir=5)), "nodes[0].data_dir", "path string"),
    ("shard_size = 6000\n" + nodes_toml(node(1)), "shard_size", "multiple of 4096"),
    ("shard_size = 2048\n" + nodes_toml(node(1)), "shard_size", "multiple of 4096"),
    ("shard_size = 0\n" + nodes_toml(node(1)), "shard_size", "multiple of 4096"),
    ('shard_size = "4.5KiB"\n' + nodes_toml(node(1)), "shard_size", "multiple of 4096"),
    ('shard_size = "big"\n' + nodes_toml(node(1)), "shard_size", "expected a size"),
    ("replicas = 3\n" + nodes_toml(node(1), node(2)), "replicas", "need at least 3 nodes"),
    ("replicas = 0\n" + nodes_toml(node(1)), "replicas", "positive integer"),
    ("replicas = -1\n" + nodes_toml(node(1)), "replicas", "positive integer"),
    ("replicas = true\n" + nodes_toml(node(1)), "replicas", "positive integer"),
    ("replicas = 1.0\n" + nodes_toml(node(1)), "replicas", "positive integer"),
    ("timeout = 0\n" + nodes_toml(node(1)), "timeout", "positive number of seconds"),
    ("timeout = -1.5\n" + nodes_toml(node(1)), "timeout", "positive number of seconds"),
    ('timeout = "10"\n' + nodes_toml(node(1)), "timeout", "positive number of seconds"),
    ("timeout = true\n" + nodes_toml(node(1)), "timeout", "positive number of seconds"),
    ("timeout = nan\n" + nodes_toml(node(1)), "timeout", "positive number of seconds"),
    ("secret_file = 5\n" + nodes_toml(node(1)), "secret_file", "path string"),
    ("rdma_gid_index = -1\n" + nodes_toml(node(1)), "rdma_gid_index", "GID table index"),
    ("rdma_gid_index = true\n" + nodes_toml(node(1)), "rdma_gid_index", "GID table index"),
    ("rdma_mtu = 9000\n" + nodes_toml(node(1)), "rdma_mtu", "one of 256, 512"),
    ('rdma_mtu = "4096"\n' + nodes_toml(node(1)), "rdma_mtu", "one of 256, 512"),
    ("lend_forwards = 1\n" + nodes_toml(node(1)), "lend_forwards", "true or false"),
    ('lend_forwards = "no"\n' + nodes_toml(node(1)), "lend_forwards", "true or false"),
]


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    BAD_CONFIGS,
    ids=[f"{i}-{key}" for i, (_, key, _) in enumerate(BAD_CONFIGS)],
)
def test_config_errors_name_file_key_problem(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: {key}: "), msg
    assert problem in msg


def test_parse_config_without_path_says_config() -> None:
    with pytest.raises(ConfigError, match=r"^config: nodes: "):
        parse_config({})


def test_infinite_timeout_allowed(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "timeout = inf\n" + nodes_toml(node(1))))
    assert cfg.timeout == float("inf")


def test_integer_timeout_becomes_float(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "timeout = 3\n" + nodes_toml(node(1))))
    assert cfg.timeout == 3.0
    assert isinstance(cfg.timeout, float)


def test_relative_data_dir_resolves_against_config_folder(tmp_path: Path) -> None:
    sub = tmp_path / "etc"
    sub.mkdir()
    text = nodes_toml(node(1, data_dir="data/n1"), node(2, data_dir="/abs/n2"))
    cfg = load_config(write(sub, text))
    assert cfg.nodes[0].data_dir == sub / "data" / "n1"
    assert cfg.nodes[1].data_dir == Path("/abs/n2")


def test_relative_data_dir_without_path_stays_relative() -> None:
    raw = {"nodes": [node(1, data_dir="data/n1")]}
    cfg = parse_config(raw)
    assert cfg.nodes[0].data_dir == Path("data/n1")
    assert cfg.path is None


# -- finding the config ------------------------------------------------------


def test_find_config_path_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IRDMA_CONFIG", raising=False)
    assert find_config_path() == Path("/etc/irdma/cluster.toml") == DEFAULT_CONFIG_PATH
    monkeypatch.setenv("IRDMA_CONFIG", str(tmp_path / "env.toml"))
    assert find_config_path() == tmp_path / "env.toml"
    assert find_config_path(tmp_path / "explicit.toml") == tmp_path / "explicit.toml"
    assert find_config_path(str(tmp_path / "x.toml")) == tmp_path / "x.toml"
    monkeypatch.setenv("IRDMA_CONFIG", "")
    assert find_config_path() == DEFAULT_CONFIG_PATH


def test_load_config_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write(tmp_path, VALID, "env.toml")
    monkeypatch.setenv("IRDMA_CONFIG", str(p))
    cfg = load_config()
    assert cfg.path == p
    assert [n.name for n in cfg.nodes] == ["n1", "n2"]
    # An explicit path wins over the environment.
    other = write(tmp_path, nodes_toml(node(7)), "other.toml")
    assert [n.name for n in load_config(other).nodes] == ["n7"]


def test_missing_env_config_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "missing.toml"
    monkeypatch.setenv("IRDMA_CONFIG", str(p))
    with pytest.raises(ConfigError) as ei:
        load_config()
    msg = str(ei.value)
    assert msg.startswith(f"{p}: config file not found")
    assert "IRDMA_CONFIG" in msg


# -- render_config -----------------------------------------------------------


def test_render_config_round_trip(tmp_path: Path) -> None:
    text = render_config(
        [
            ("a", "tcp://127.0.0.1:7401", str(tmp_path / "a"), 8 << 20),
            ("b", "tcp://[::1]:7402", str(tmp_path / "b"), 16 << 20),
        ],
        shard_size=1 << 20,
        replicas=2,
        timeout=1.5,
        extra={"heartbeat": 0.25, "lend_forwards": False},
    )
    cfg = load_config(write(tmp_path, text))
    assert (cfg.heartbeat, cfg.lend_forwards) == (0.25, False)
    assert cfg.shard_size == 1 << 20
    assert cfg.replicas == 2
    assert cfg.timeout == 1.5
    assert [(n.name, str(n.address), n.data_dir, n.arena_size) for n in cfg.nodes] == [
        ("a", "tcp://127.0.0.1:7401", tmp_path / "a", 8 << 20),
        ("b", "tcp://[::1]:7402", tmp_path / "b", 16 << 20),
    ]


# -- placement ---------------------------------------------------------------


def make_config(names: list[str], replicas: int = 1) -> ClusterConfig:
    nodes = [
        {"name": name, "address": f"tcp://10.0.0.1:{7000 + i}", "arena_size": "1GiB"}
        for i, name in enumerate(names)
    ]
    return parse_config({"nodes": nodes, "replicas": replicas})


PAIRS = [(tensor_key(f"model/layer{i}.weight"), s) for i in range(300) for s in range(10)]


def test_placement_deterministic_and_primary_first() -> None:
    cfg = make_config(["n1", "n2", "n3", "n4"], replicas=3)
    for key, shard in PAIRS[:200]:
        reps = cfg.replicas_for(key, shard)
        assert len(reps) == 3
        assert len({n.name for n in reps}) == 3
        assert cfg.replicas_for(key, shard) == reps
        assert cfg.primary_for(key, shard) == reps[0]
        order = rendezvous_order(cfg.nodes, key, shard)
        assert sorted(n.name for n in order) == ["n1", "n2", "n3", "n4"]
        assert tuple(order[:3]) == reps


def test_placement_varies_with_key_and_shard() -> None:
    cfg = make_config(["n1", "n2", "n3", "n4"])
    primaries = {cfg.primary_for(key, shard).name for key, shard in PAIRS[:100]}
    assert primaries == {"n1", "n2", "n3", "n4"}
    # Shards of one tensor spread over nodes too.
    key = tensor_key("one/tensor")
    assert len({cfg.primary_for(key, s).name for s in range(64)}) == 4


def test_placement_same_across_separately_parsed_configs(tmp_path: Path) -> None:
    names = ["alpha", "beta", "gamma", "delta"]
    a = load_config(write(tmp_path, render_nodes(names, replicas=2), "a.toml"))
    # Same nodes, listed in another order, in another file, with other addresses.
    b = make_config(list(reversed(names)), replicas=2)
    for key, shard in PAIRS[:500]:
        ra = [n.name for n in a.replicas_for(key, shard)]
        rb = [n.name for n in b.replicas_for(key, shard)]
        assert ra == rb


def render_nodes(names: list[str], replicas: int) -> str:
    nodes = [(n, f"tcp://127.0.0.1:{7401 + i}", "/d", 1 << 20) for i, n in enumerate(names)]
    return render_config(nodes, replicas=replicas)


def test_placement_balance() -> None:
    cfg = make_config(["n1", "n2", "n3", "n4"])
    counts = Counter(cfg.primary_for(key, shard).name for key, shard in PAIRS)
    assert len(PAIRS) == 3000
    assert set(counts) == {"n1", "n2", "n3", "n4"}
    for name, c in counts.items():
        assert 0.20 * len(PAIRS) <= c <= 0.30 * len(PAIRS), (name, c)


def test_adding_node_moves_few_shards() -> None:
    four = make_config(["n1", "n2", "n3", "n4"])
    five = make_config(["n1", "n2", "n3", "n4", "n5"])
    moved = 0
    for key, shard in PAIRS:
        before = four.primary_for(key, shard).name
        after = five.primary_for(key, shard).name
        if before != after:
            moved += 1
            # Rendezvous: a shard only ever moves to the new node.
            assert after == "n5"
    frac = moved / len(PAIRS)
    assert 0.10 < frac < 0.30, frac


def test_removing_node_moves_only_its_shards() -> None:
    four = make_config(["n1", "n2", "n3", "n4"])
    three = make_config(["n1", "n2", "n4"])
    for key, shard in PAIRS[:1000]:
        before = four.primary_for(key, shard).name
        if before != "n3":
            assert three.primary_for(key, shard).name == before


# -- membership in etcd ([etcd]) --------------------------------------------------------

ETCD = '\n[etcd]\nendpoints = ["http://10.0.0.5:2379"]\n'


def test_an_etcd_table_has_defaults_and_names_bad_values(tmp_path: Path) -> None:
    path = write_config(tmp_path, 2, replicas=2)
    path.write_text(path.read_text() + ETCD)
    settings = load_config(path).etcd
    assert settings is not None
    assert settings.endpoints == ("http://10.0.0.5:2379",)
    assert (settings.prefix, settings.lease_ttl, settings.replace_after) == (
        "/irdma/default",
        2,
        30.0,
    )
    for bad, named in (
        ('endpoints = ["10.0.0.5:2379"]', r"etcd\.endpoints"),
        ('endpoints = ["http://a:1"]\nlease_ttl = 0', r"etcd\.lease_ttl"),
        ('endpoints = ["http://a:1"]\nreplace_after = -1', r"etcd\.replace_after"),
        ('endpoints = ["http://a:1"]\nprefix = "nope/"', r"etcd\.prefix"),
        ('endpoints = ["http://a:1"]\nwhat = 1', r"etcd\.what"),
    ):
        path.write_text(write_config(tmp_path, 2).read_text() + f"\n[etcd]\n{bad}\n")
        with pytest.raises(ConfigError, match=named):
            load_config(path)


def test_a_client_config_may_name_only_etcd(tmp_path: Path) -> None:
    path = tmp_path / "client.toml"
    path.write_text("replicas = 2\n" + ETCD)
    config = load_config(path)
    assert config.nodes == () and config.replicated
    path.write_text("replicas = 2\n")
    with pytest.raises(ConfigError, match="nodes"):
        load_config(path)


def test_etcd_endpoints_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    path = write_config(tmp_path, 2)
    monkeypatch.setenv("IRDMA_ETCD_ENDPOINTS", "http://10.0.0.7:2379, http://10.0.0.8:2379")
    settings = load_config(path).etcd
    assert settings is not None and settings.endpoints == (
        "http://10.0.0.7:2379",
        "http://10.0.0.8:2379",
    )
    monkeypatch.setenv("IRDMA_ETCD_ENDPOINTS", "10.0.0.7")
    with pytest.raises(ConfigError, match=r"etcd\.endpoints"):
        load_config(path)


def test_a_config_follows_an_epoch(tmp_path: Path) -> None:
    """Nodes and placement become the epoch's; a node of the file keeps its data_dir; a
    move's target daemons keep copies (``holds``, ``copies_for``) but place nothing."""
    path = write_config(tmp_path, 3, replicas=2)
    path.write_text(path.read_text() + ETCD)
    config = load_config(path)
    n1 = config.node("n1")
    addresses = (("n1", "tcp://10.1.0.1:7401"), ("n2", "tcp://10.1.0.2:7401"),
                 ("n4", "tcp://10.1.0.4:7401"))  # fmt: skip
    moving = Epoch(5, ("n1", "n2"), 2, ("n1", "n2", "n4"), addresses)
    in_force = ConfigInForce(config)
    assert in_force.adopt(moving)
    config = in_force.config
    assert [n.name for n in config.nodes] == ["n1", "n2", "n4"]
    assert [n.name for n in config.members] == ["n1", "n2"]
    assert config.node("n1").data_dir == n1.data_dir
    assert str(config.node("n4").address) == "tcp://10.1.0.4:7401"
    with pytest.raises(ConfigError, match="n3"):
        config.node("n3")
    gained = [s for s in range(200) if config.holds("n4", 9, s)]
    assert gained and all(
        "n4" not in [n.name for n in config.replicas_for(9, s)]
        and config.copies_for(9, s)[-1].name == "n4"
        for s in gained
    )
    assert in_force.adopt(moving.switched())
    config = in_force.config
    assert [n.name for n in config.members] == ["n1", "n2", "n4"]
    assert all(config.holds("n4", 9, s) for s in gained)
    assert all(config.copies_for(9, s) == config.replicas_for(9, s) for s in range(200))
