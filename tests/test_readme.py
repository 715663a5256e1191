"""The README is a quickstart that works as written; the rest of the documentation is
in docs/, every link resolves, and nothing points outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .helpers.cluster import make_cluster

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Build output and environments: not the project's own text.
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}


def fenced_blocks(text: str, language: str) -> list[str]:
    """The contents of the ```language blocks of a markdown text."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_readme_python_snippet_runs_as_written(tmp_path: Path) -> None:
    # The section's blocks, one after another, as a reader would run them.
    snippet = "\n".join(fenced_blocks(section(README.read_text(), "From Python"), "python"))
    cluster = make_cluster(tmp_path / "cluster", arena_size=64 << 20)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", snippet],
            capture_output=True,
            text=True,
            env=dict(os.environ, IRDMA_CONFIG=str(cluster.config_path)),
            cwd=tmp_path,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        # It prints the version, the names and the scalar it read back, and cleans up.
        assert "['model/b', 'model/step', 'model/w'] 0" in proc.stdout
        with cluster.client() as c:
            assert c.list("model/") == []
    finally:
        cluster.close()


def test_readme_is_a_quickstart_that_names_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 300
    for command in ("deploy/demo.sh", "tests/run.sh"):
        assert f"{command} " in section(text, "The two commands")
        assert os.access(ROOT / command, os.X_OK)
    for heading in ("Install", "Start a local cluster", "Put and get", "From Python", "Mount"):
        assert f"\n## {heading}\n" in text
    assert "pip install '.[fuse]'" in section(text, "Install")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a markdown file's headings."""
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        out.add(slug)
    return out


def test_every_relative_link_resolves() -> None:
    for page in [README, *DOCS]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: link to {target} (no such file)"
            assert ROOT in dest.parents or dest == ROOT, f"{page.name}: {target} leaves the project"
            if anchor:
                assert anchor in anchors(dest), f"{page.name}: no heading for {target}"


def test_the_docs_pages_are_linked_from_the_readme() -> None:
    text = README.read_text()
    for page in DOCS:
        assert f"(docs/{page.name})" in text, f"docs/{page.name} is not linked from README.md"


def test_nothing_links_outside_the_repository() -> None:
    needle = "../" + "shared"  # split, so this file does not contain it either
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath, name)
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue  # binary files
            assert needle not in text, f"{path.relative_to(ROOT)} refers to {needle}"
