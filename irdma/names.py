"""Tensor names as the command line sees them: patterns, groups and internal markers.

A pattern is a tensor name with shell-style wildcards: ``*`` and ``?`` match
within one ``/``-separated part, ``**`` matches across parts, ``[...]`` is a
character class. Anything without a wildcard is a plain name or prefix.
"""

from __future__ import annotations

import re
from functools import lru_cache

# `mkdir` in the mount stores this zero-size tensor in the new directory so the
# directory exists for every mount; it is not data, so listings hide it.
DIR_MARKER = ".irdma-dir"

WILDCARDS = frozenset("*?[")


def is_pattern(text: str) -> bool:
    """Whether ``text`` has a wildcard (and so names every tensor it matches)."""
    return any(c in WILDCARDS for c in text)


def literal_prefix(pattern: str) -> str:
    """The part of ``pattern`` before its first wildcard: every match starts with it."""
    for i, c in enumerate(pattern):
        if c in WILDCARDS:
            return pattern[:i]
    return pattern


def group_root(pattern: str) -> str:
    """The folder a pattern's matches are named relative to (``m/`` for ``m/*.w``)."""
    head = literal_prefix(pattern)
    return head[: head.rfind("/") + 1]


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2)  # a ']' right after '[' belongs to the class
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def matches(pattern: str, name: str) -> bool:
    """Whether tensor ``name`` matches ``pattern`` (see the module doc)."""
    return _compile(pattern).match(name) is not None


def is_internal(name: str) -> bool:
    """Whether a tensor is bookkeeping rather than data (a directory marker)."""
    return name.rsplit("/", 1)[-1] == DIR_MARKER


def relative(name: str, root: str) -> str:
    """``name`` without the group root ``root`` (``fc.weight`` for ``resnet/`` and
    ``resnet/fc.weight``)."""
    return name[len(root) :] if root and name.startswith(root) else name


def base_name(name: str) -> str:
    """The last part of a tensor name."""
    return name.rsplit("/", 1)[-1]
