"""How the ``irdma`` command ends when something goes wrong: one place, one line.

- Ctrl-C exits 130 without a traceback, also when a trio nursery delivers the
  KeyboardInterrupt wrapped in an exception group.
- A closed stdout (``irdma status --json | head``) ends the command quietly,
  with the status a shell gives a process killed by SIGPIPE (141).
- Expected failures (irdma errors, bad files, OS errors) print one line each,
  ``irdma: ...``; exit 2 for configuration errors, 1 for the rest.
- Anything else is a bug: it keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..errors import ConfigError, IrdmaError

EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE

EXPECTED = (IrdmaError, ValueError, OSError)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def message(exc: BaseException) -> str:
    """One line for an expected error, naming the file for OS errors."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing at exit does not fail again on the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def guarded(prog: str, fn: Callable[[], int]) -> int:
    """Run ``fn`` (a command) and turn how it fails into an exit status."""
    try:
        return fn()
    except SystemExit:
        raise
    except BaseException as exc:  # every way out passes here: see the module doc
        return exit_status(prog, exc)


def exit_status(prog: str, exc: BaseException) -> int:
    """Report ``exc`` as the module doc says and return the exit status; re-raise a bug."""
    found = leaves(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in found):
        print(file=sys.stderr)  # end the line the terminal's ^C is on
        return EXIT_INTERRUPTED
    if any(isinstance(e, BrokenPipeError) for e in found):
        silence_stdout()
        return EXIT_BROKEN_PIPE
    if not all(isinstance(e, EXPECTED) for e in found):
        raise exc
    seen = []
    for e in found:
        line = message(e)
        if line not in seen:
            seen.append(line)
            print(f"{prog}: {line}", file=sys.stderr)
    return EXIT_CONFIG if all(isinstance(e, ConfigError) for e in found) else EXIT_FAILURE
