"""Which package may import what (docs/architecture.md): read from the source, no daemons."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the daemon shares with clients under irdma.transport: stream errors and
# waits (base), framing and the request/answer connection its peer links use
# (tcp), the handshake's stream type (auth), same-host plumbing (unix), the
# verbs wrapper. Never a client bulk path, the blocking shell or the selection.
PSD_MAY_USE = {"base", "tcp", "auth", "unix", "verbs", "verbs_compat"}


def imports_of(package: str) -> dict[str, set[str]]:
    """Module names each file of ``package`` (subfolders too) imports (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        out[str(path.relative_to(ROOT / package))] = names
    return out


def test_the_daemon_uses_only_the_shared_parts_of_irdma_transport() -> None:
    used = {
        (file, name.split(".")[2])
        for file, names in imports_of("psd").items()
        for name in names
        if name.startswith("irdma.transport.") and name.count(".") >= 2
    }
    assert used, "psd imports nothing from irdma.transport? the check reads the wrong files"
    wrong = sorted((f, m) for f, m in used if m not in PSD_MAY_USE)
    assert not wrong, f"psd imports client transport internals: {wrong}"


def test_no_transport_subclasses_another() -> None:
    text = "\n".join(p.read_text() for p in (ROOT / "irdma" / "transport").glob("*.py"))
    assert "(TcpConnection)" not in text and "class TcpConnection" not in text


def test_irdma_imports_neither_the_daemon_nor_the_mount() -> None:
    for file, names in imports_of("irdma").items():
        assert not {n for n in names if n.split(".")[0] in ("psd", "irdma_psd", "irdma_fuse")}, file


def test_the_mount_uses_only_the_public_api() -> None:
    """fuse/ imports ``irdma`` and ``irdma.errors``, and only names they export."""
    used = sorted(
        {
            (f, n)
            for f, names in imports_of("fuse").items()
            for n in names
            if n.split(".")[0] == "irdma"
        }
    )
    assert used, "fuse imports nothing from irdma? the check reads the wrong files"
    wrong = [(f, n) for f, n in used if not _public(n)]
    assert not wrong, f"fuse imports irdma internals: {wrong}"


def _public(name: str) -> bool:
    """``irdma``, ``irdma.errors`` or a name exported from either."""
    import irdma
    import irdma.errors

    if name in ("irdma", "irdma.errors"):
        return True
    module, _, attr = name.rpartition(".")
    if module == "irdma":
        return attr in irdma.__all__
    return module == "irdma.errors" and hasattr(irdma.errors, attr)


def test_every_package_is_in_the_distribution() -> None:
    """A package missing from pyproject's list is absent from ``pip install .`` (not from an
    editable install, so only the installed units would notice): irdma.protocol was."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "irdma").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert on_disk <= listed, f"not in pyproject.toml's packages: {sorted(on_disk - listed)}"


# -- import circles --------------------------------------------------------------

# The import names of the three source folders (pyproject's package-dir).
FOLDERS = {"irdma": "irdma", "irdma_psd": "psd", "irdma_fuse": "fuse"}
# Circles tolerated for now, each to be removed (the test fails once one is gone,
# so its entry goes with it). None today: the client/shells one went with the
# client package.
KNOWN_CIRCLES: list[set[str]] = []


def module_files() -> dict[str, Path]:
    """Every module of the three packages by its import name (a package by its own)."""
    out: dict[str, Path] = {}
    for name, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Which of the three packages' modules each one imports, anywhere in it
    (functions and ``if TYPE_CHECKING:`` too: a circle hidden there is still one).

    ``from P import x`` is an edge to ``P.x`` where that is a module, else to ``P``;
    importing ``P.x`` also runs ``P/__init__``, which is not counted (every module
    would then import its package, and a package's modules, in a circle)."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                found.update(
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                )
        graph[module] = {n for n in found if n in files and n != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_circles_finds_a_circle_and_only_the_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f"}}
    assert circles(graph) == [{"a", "b", "c"}]


def test_the_graph_reads_relative_type_checking_and_function_imports() -> None:
    graph = import_graph()
    assert "irdma.cluster.placement" in graph["irdma.cluster.epochs"]  # from .placement
    assert "irdma.cluster.config" in graph["irdma.cluster.configfile"]
    assert "irdma.errors" in graph["irdma.cli.boundary"]  # from ..errors
    assert "irdma_fuse.snapshot" in graph["irdma_fuse.files"]  # under TYPE_CHECKING


def test_no_import_circle_among_irdma_psd_and_fuse_modules() -> None:
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"import circles (modules that import each other, directly or not): {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"no longer a circle: remove it from KNOWN_CIRCLES: {gone}"


# -- the layout by role ----------------------------------------------------------

# Each folder of irdma/ is one role (docs/architecture.md), with the modules it holds.
SUBPACKAGES = {
    "irdma.client": {
        "facade",
        "blocking",
        "shells",
        "session",
        "planner",
        "datapath",
        "onesided",
        "routing",
        "batching",
        "retry",
    },
    "irdma.cli": {"main", "boundary", "tensorcmds", "tensorfiles", "local", "localdir"},
    "irdma.cluster": {"config", "configfile", "placement", "epochs", "etcd", "registry"},
    "irdma.training": {"modes", "collectives", "worker"},
    "irdma_psd.store": {"store", "records", "rules", "copies", "blocks", "catalogue", "steps"},
    "irdma_psd.replication": {"replicator", "links", "forwarding", "heartbeats", "catchup"},
    "irdma.protocol": {"frame", "messages", "conversation"},
    "irdma.transport": {"base", "tcp", "shm", "rdma"},
}


def test_each_role_is_a_subpackage_holding_its_modules() -> None:
    files = module_files()
    for package, modules in SUBPACKAGES.items():
        assert files.get(package, Path()).name == "__init__.py", f"{package} is not a package"
        missing = sorted(m for m in modules if f"{package}.{m}" not in files)
        assert not missing, f"{package} lacks {missing}"
        # None left beside the package under its old name (irdma/epochs.py ...).
        top = package.split(".")[0]
        beside = sorted(
            m for m in modules if files.get(f"{top}.{m}", Path("__init__.py")).name != "__init__.py"
        )
        assert not beside, f"still at the top of {top}: {beside}"


def test_the_daemon_and_the_mount_are_imported_by_their_distribution_names() -> None:
    """``psd/`` is the package ``irdma_psd`` and ``fuse/`` is ``irdma_fuse``
    (pyproject.toml maps them: ``fuse`` is another project's module name on PyPI, and
    the top-level folders are the layout users read). Importing a folder by its own
    name would load a second copy of every module, with classes unequal to the
    first's: nothing does. (A script importing a module beside it, such as
    bench/fuse.py, is not the folder.)"""
    wrong = sorted(
        (f"{package}/{file}", name)
        for package in ("irdma", "psd", "fuse", "tests", "bench", "examples")
        if (ROOT / package).is_dir()
        for file, names in imports_of(package).items()
        for name in names
        if name.split(".")[0] in ("psd", "fuse")
        and not (ROOT / package / Path(file).parent / f"{name.split('.')[0]}.py").exists()
    )
    assert not wrong, f"imported by folder name, not as irdma_psd / irdma_fuse: {wrong}"


# -- the tests' own layout (docs/testing.md) ----------------------------------------

TESTS = ROOT / "tests"
HELPERS = TESTS / "helpers"


def top_level_defs(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [n for n in ast.parse(path.read_text(), str(path)).body if isinstance(n, defs)]


def helper_names(helpers: Path) -> dict[str, list[str]]:
    """Each public function or class of ``helpers`` by name: the modules defining it."""
    out: dict[str, list[str]] = {}
    for path in sorted(helpers.glob("*.py")):
        for node in top_level_defs(path):
            if not node.name.startswith("_"):
                out.setdefault(node.name, []).append(path.name)
    return out


def test_a_helper_is_defined_once_in_tests_helpers_and_nowhere_else() -> None:
    """A helper the tests share is written once, in tests/helpers; a test module that
    needs one imports it (a same name with another meaning takes another name)."""
    helpers = helper_names(HELPERS)
    assert "make_cluster" in helpers, "the check reads the wrong folder"
    twice = {name: modules for name, modules in helpers.items() if len(modules) > 1}
    assert not twice, f"defined in several helpers modules: {twice}"
    again = sorted(
        (str(path.relative_to(TESTS)), node.name)
        for path in TESTS.rglob("*.py")
        if HELPERS not in path.parents
        for node in top_level_defs(path)
        if node.name in helpers
    )
    assert not again, f"defined again beside tests/helpers (import it instead): {again}"


def is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """Decorated ``@pytest.fixture`` or ``@pytest.fixture(...)``."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) == "pytest.fixture":
            return True
    return False


def test_conftest_files_hold_fixtures_and_nothing_imports_from_them() -> None:
    conftests = sorted(TESTS.rglob("conftest.py"))
    assert TESTS / "conftest.py" in conftests, "the check reads the wrong folder"
    not_fixtures = sorted(
        (str(path.relative_to(TESTS)), node.name)
        for path in conftests
        for node in top_level_defs(path)
        if not is_fixture(node)
    )
    assert not not_fixtures, f"helpers in a conftest.py (they go in tests/helpers): {not_fixtures}"
    importers = sorted(
        str(path.relative_to(ROOT))
        for path in [*TESTS.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "conftest"
    )
    assert not importers, f"import from a conftest.py (import tests/helpers instead): {importers}"
