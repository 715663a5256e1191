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
    """Module names each file of ``package`` imports (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        out[path.name] = names
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
