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

pytest_exit() { # pytest's status, with "no tests collected" (5) a failure
    if [ "$1" -eq 5 ]; then
        echo "tests/run.sh: pytest ($2) collected no tests; that is a failure" >&2
        return 1
    fi
    return "$1"
}

# The slowest tests are listed at the end: the suite is kept well under 30 minutes.
if [ "$#" -gt 0 ]; then
    .venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
    pytest_exit $? "tests/run.sh $*"
    exit $?
fi

# The whole suite. The two qemu guests (soft-RoCE, systemd) are emulated CPU work
# while most host tests wait on daemons and timers: they run beside the host
# suite, niced so that the host tests' timers keep their CPU, their output kept
# and printed once both are done.
GUESTS=(tests/rdma/test_in_vm.py tests/systemd/test_units_in_vm.py)
guest_log=$(mktemp /tmp/irdma-guests.XXXXXX.log)
nice -n 10 .venv/bin/python -m pytest -p no:cacheprovider --durations=10 "${GUESTS[@]}" \
    >"$guest_log" 2>&1 &
guest_pid=$!
trap 'kill "$guest_pid" 2>/dev/null' EXIT
ignore=()
for g in "${GUESTS[@]}"; do ignore+=(--ignore="$g"); done
host_log=$(mktemp /tmp/irdma-host.XXXXXX.log)
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "${ignore[@]}" | tee "$host_log"
pytest_exit "${PIPESTATUS[0]}" "host suite"
host=$?
wait "$guest_pid"
pytest_exit $? "guests"
guests=$?
trap - EXIT
echo
echo "==================== the qemu guests (run beside the host suite) ===================="
cat "$guest_log"
# The host suite's verdict again, last, where a reader of the log's tail looks.
echo "==================== the host suite's summary, again ===================="
if grep -q "short test summary info" "$host_log"; then
    sed -n '/short test summary info/,$p' "$host_log" | tail -n 60
else
    tail -n 1 "$host_log"
fi
rm -f "$guest_log" "$host_log"
echo "tests/run.sh: host suite exit $host, guests exit $guests"
[ "$host" -eq 0 ] && [ "$guests" -eq 0 ]
