#!/usr/bin/env bash
# The test command: set up (apt packages, .venv) and run lint, the type
# checker and the whole suite. Extra arguments go to pytest (e.g. tests/run.sh -k client).
set -uo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh || exit 1
.venv/bin/ruff check . || exit 1
.venv/bin/ruff format --check . || exit 1
# Static types of irdma, psd and fuse ([tool.mypy] in pyproject.toml).
.venv/bin/mypy || exit 1
# The slowest tests are listed at the end: the suite is kept well under 30 minutes.
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "tests/run.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$status"
