"""Install irdma into a virtualenv as ``deploy/install.sh`` does, without network or pip.

Run inside the systemd guest (``tests/systemd/guest_run.sh``) by the guest's
own python3: ``python3 install_offline.py SRC VENV``. The result has the
layout of ``install.sh``'s ``pip install '.[fuse]'`` (not editable): a
virtualenv at VENV that sees the system's site directories (install.sh makes
it with ``--system-site-packages``, for the distribution's pyverbs), irdma's
packages copied into its site-packages under their import names (as
pyproject.toml's ``[tool.setuptools]`` maps them) and byte-compiled there, a
``.dist-info`` with the entry points (``irdma mount`` is found through the
``irdma.commands`` group), and the ``console_scripts`` as executables in
VENV/bin with VENV's python in their ``#!`` line.

What pip would also do and this does not: fetch the dependencies. The guest
image has them already, at the host .venv's versions, in
/usr/local/lib/python3.11/dist-packages (``tests/rdma/vm.sh``), which the
venv sees as a system site directory.
"""

from __future__ import annotations

import compileall
import shutil
import sys
import tomllib
import venv
from pathlib import Path

SCRIPT = """\
#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {func}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({func}())
"""


def install(src: Path, prefix: Path) -> None:
    project = tomllib.loads((src / "pyproject.toml").read_text())
    meta = project["project"]
    setup = project["tool"]["setuptools"]
    # Not symlinks=False: install.sh's `python3 -m venv` links bin/python too.
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(prefix)
    site = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    # The packages: each listed one's own .py files (setuptools' rule), from
    # the folder package-dir names for its top-level package.
    package_dir = setup.get("package-dir", {})
    tops = set()
    for package in setup["packages"]:
        top, *rest = package.split(".")
        tops.add(top)
        source = src / package_dir.get(top, top)
        source = source.joinpath(*rest)
        target = site.joinpath(top, *rest)
        target.mkdir(parents=True, exist_ok=True)
        for py in sorted(source.glob("*.py")):
            shutil.copy2(py, target / py.name)

    # The distribution's metadata: enough for importlib.metadata (version, entry points).
    name, version = meta["name"], meta["version"]
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in meta.get("dependencies", [])]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "INSTALLER").write_text("tests/systemd/install_offline.py\n")
    groups = {"console_scripts": meta.get("scripts", {}), **meta.get("entry-points", {})}
    text = ""
    for group, entries in groups.items():
        text += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
    (info / "entry_points.txt").write_text(text)

    # The executables, as pip writes them.
    python = prefix / "bin" / "python"
    for script, target in meta.get("scripts", {}).items():
        module, _, func = target.partition(":")
        path = prefix / "bin" / script
        path.write_text(SCRIPT.format(python=python, module=module, func=func))
        path.chmod(0o755)

    # Bytecode next to the sources, as pip compiles it: the units run with a
    # read-only /opt (ProtectSystem=strict), where no cache could be written.
    for top in sorted(tops):
        if not compileall.compile_dir(site / top, quiet=1):
            raise SystemExit(f"install_offline: {site / top} does not compile")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: install_offline.py SRC VENV")
    install(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"install_offline: irdma installed into {sys.argv[2]}")
