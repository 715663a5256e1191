#!/usr/bin/env bash
# Boot the systemd guest once and run the watchdog check N more times after the
# usual ones (guest_checks.py, IRDMA_GUEST_REPEAT), stopping at the first failure:
# how a failure seen once in tests/systemd/test_units_in_vm.py is hunted. The
# results (checks.json, journal.txt, guest.log) go to a fresh directory under /tmp.
#
#   tests/systemd/loop-in-guest.sh 15
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
runs=${1:?usage: $0 N}
results=$(mktemp -d /tmp/irdma-systemd-loop.XXXX)
printf 'export IRDMA_GUEST_REPEAT=%d\nexec sh /src/tests/systemd/guest_run.sh\n' "$runs" \
    > "$results/cmd.sh"
status=0
VM_WAIT=${VM_WAIT:-3600} GUEST_INIT=systemd QEMU_TIMEOUT=${QEMU_TIMEOUT:-$((900 + 150 * runs))} \
    bash "$HERE/../rdma/vm.sh" run "$results" || status=$?
grep -E "^\[checks .*(ok|FAILED) \(" "$results/guest.log" || true
echo "results in $results"
exit "$status"
