"""bench/compare.py's chart: which panels it draws and which colour each system
gets, decided by pure functions (the drawing itself is matplotlib's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from irdma.cluster.config import SCHEMES

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    # Loaded under a name of its own: bench/ is no package, and its dataclasses
    # look their module up in sys.modules.
    spec = importlib.util.spec_from_file_location("bench_compare", BENCH / "compare.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def every_system() -> list[str]:
    """Every system name bench/compare.py gives its rows (measure_* functions)."""
    names = ["iperf3", "numpy", "redis (hiredis)", "mpi", "gloo"]
    for transport in SCHEMES:
        names += [f"irdma {transport}", f"irdma {transport} R=2", f"irdma group {transport}"]
    names += ["irdma shm via daemon", "irdma shm shared", "irdma group shm shared"]
    return names


def test_panels_only_for_families_with_measured_rows(compare: ModuleType) -> None:
    Row = compare.Row
    mib = 1 << 20
    rows = [
        Row("iperf3", "stream", 0, gbps=4.4),
        Row("numpy", "copy", 4096, seconds=4e-7, gbps=10.2),
        Row("redis (hiredis)", "GET", 4096, seconds=1.1e-4, gbps=0.037),
        Row("irdma shm", "read", 4096, seconds=5e-6, gbps=0.85),
        Row("irdma tcp", "read", 256 * mib, seconds=0.1, gbps=2.7),
        Row("mpi", "*", 0, note="not installed: apt-get install openmpi-bin"),
        Row("gloo", "broadcast", 64 * mib, 2, note="n/a (timed out)"),
        Row("gloo", "allreduce", 64 * mib, 2, seconds=0.04, gbps=1.7),
        Row("irdma group shm", "allreduce", 64 * mib, 2, seconds=0.03, gbps=2.4),
    ]
    found = compare.panels(rows)
    assert [family for family, _ in found] == ["small requests", "large transfers", "allreduce"]
    by_family = {family: {(r.system, r.op) for r in rs} for family, rs in found}
    assert by_family["small requests"] == {
        ("numpy", "copy"),
        ("redis (hiredis)", "GET"),
        ("irdma shm", "read"),
    }
    assert by_family["large transfers"] == {("iperf3", "stream"), ("irdma tcp", "read")}
    assert by_family["allreduce"] == {("gloo", "allreduce"), ("irdma group shm", "allreduce")}
    # Rows that are only notes draw nothing, not even an empty panel.
    assert compare.panels(rows[5:7]) == []


def test_redis_get_stands_beside_irdma_read(compare: ModuleType) -> None:
    Row = compare.Row
    get = compare.category_of(Row("redis (hiredis)", "GET", 4096, seconds=1e-4, gbps=0.04))
    read = compare.category_of(Row("irdma tcp", "read", 4096, seconds=2e-4, gbps=0.02))
    assert get == read


def test_every_system_has_a_colour_of_its_own(compare: ModuleType) -> None:
    systems = every_system()
    colours = compare.system_colours(systems)
    assert len(set(colours.values())) == len(systems), colours
    # Fixed: a system's colour does not depend on what else the run measured.
    for system in systems:
        assert compare.system_colours([system])[system] == colours[system]
    # The detail in brackets is not another system.
    both = compare.system_colours(["redis (hiredis)", "redis (no hiredis)"])
    assert both["redis (hiredis)"] == both["redis (no hiredis)"] == colours["redis (hiredis)"]


def test_systems_without_a_fixed_colour_take_spare_ones(compare: ModuleType) -> None:
    others = ["irdma tcp R=3", "irdma shm R=3"]
    colours = compare.system_colours([*every_system(), *others])
    assert len(set(colours.values())) == len(colours)
    assert not {colours[s] for s in others} & set(compare.SYSTEM_COLOURS.values())
    too_many = [f"irdma tcp R={n}" for n in range(3, 4 + len(compare.SPARE_COLOURS))]
    with pytest.raises(ValueError, match="without a colour of their own"):
        compare.system_colours(too_many)
