"""Which FUSE session the ``mount`` fixture serves with: a pytest plugin
(tests/conftest.py loads it), as the hook that runs a module once per session
cannot be a fixture.

A test run's mounts use irdma mount's default session (the own one), or
$IRDMA_TEST_MOUNT_SESSION. A module that sets ``MOUNT_SESSIONS`` (say
``("own", "pyfuse3")``) has each of its tests that use ``mount`` run once per
session named: pyfuse3 stays a supported fallback (kernels the own session
cannot speak to), so some of the mount's promises are checked against it too.
"""

from __future__ import annotations

import pytest


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    sessions = getattr(metafunc.module, "MOUNT_SESSIONS", None)
    if sessions and "mount" in metafunc.fixturenames:
        # Module-scoped, so the module's cluster (which asks for it) is one per
        # session: the runs of a test name the same tensors.
        metafunc.parametrize("mount_session", sessions, indirect=True, scope="module")


@pytest.fixture(scope="module")
def mount_session(request: pytest.FixtureRequest) -> str | None:
    """The session ``mount`` uses (None: the run's default)."""
    return getattr(request, "param", None)
