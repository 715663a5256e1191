"""The command line that runs one of irdma's modules in a child process.

``python -m MODULE`` puts the current directory first on ``sys.path``, so a
child started from a directory holding an ``irdma/`` folder (a cluster's
directory, the parent of a clone) imports that folder instead of the
installed package. ``-P`` (Python 3.11+, irdma's minimum) leaves the current
directory out and keeps everything else (the venv, an editable install,
``PYTHONPATH``), unlike ``-I``, which would drop ``PYTHONPATH`` too.
"""

from __future__ import annotations

import sys


def python_module(module: str, *args: str) -> list[str]:
    """``[python, -P, -m, module, *args]`` with this process's interpreter."""
    return [sys.executable, "-P", "-m", module, *args]
