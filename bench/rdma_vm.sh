#!/usr/bin/env bash
# bench/rdma_vm.sh: run bench/rdma.py inside the soft-RoCE guest (tests/rdma/vm.sh)
# and print its output. Arguments go to bench/rdma.py; the figures are also
# kept in bench/results/rdma.json.
set -euo pipefail
cd "$(dirname "$0")/.."
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
printf 'exec python3 bench/rdma.py --json /results/rdma.json %s\n' "$*" > "$results/cmd.sh"
rc=0
tests/rdma/vm.sh run "$results" || rc=$?
cat "$results/guest.log"
mkdir -p bench/results
[ -f "$results/rdma.json" ] && cp "$results/rdma.json" bench/results/rdma.json
exit "$rc"
