#!/usr/bin/env bash
# Loop a selection of the RDMA suite N times in one boot of the soft-RoCE guest and
# count the failures: how a fix in the RDMA path is shown to hold under repetition
# (after a test that fails every time without it). Failing runs' logs are kept.
#
#   tests/rdma/loop-in-guest.sh N PYTEST_ARGS...
#   tests/rdma/loop-in-guest.sh 50 -k "torn_shard or killed_daemon"
#
# The results (guest.log, run-K.log of each failing run) go to a fresh directory
# under /tmp, printed at the end; the exit status is 0 only if every run passed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
runs=${1:?usage: $0 N PYTEST_ARGS...}
shift
results=$(mktemp -d /tmp/irdma-guest-loop.XXXX)
args=""
[ $# -eq 0 ] || args=$(printf ' %q' "$@")  # none: the whole file, not an empty ''
cat > "$results/cmd.sh" <<CMD
fails=0
for i in \$(seq 1 $runs); do
  if python3 -m pytest -p no:cacheprovider -q -x -o timeout=600 tests/rdma/test_rdma_transport.py$args \\
      > /results/run-\$i.log 2>&1; then
    echo "run \$i passed: \$(tail -n 1 /results/run-\$i.log)"
    rm -f /results/run-\$i.log
  else
    fails=\$((fails + 1))
    echo "run \$i FAILED: \$(grep -m 2 -E 'Error|assert|FAILED' /results/run-\$i.log | tr '\n' ' ')"
  fi
done
echo "\$fails of $runs runs failed"
[ "\$fails" -eq 0 ]
CMD
status=0
# another guest on this host (the suite's) finishes first: two starve each other
VM_WAIT=${VM_WAIT:-3600} bash "$HERE/vm.sh" run "$results" || status=$?
grep -E "^run |runs failed" "$results/guest.log" || true
echo "results in $results"
exit "$status"
