#!/usr/bin/env bash
# The main job, on the embedded default: set up, start a local cluster of 3
# daemons keeping 2 copies of every shard, put a model and get it back, mount
# it, train a CNN on digits through the client and through the mount, hang a
# daemon and keep working, benchmark, and stop everything. Run as root on
# Debian or Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
work=$(mktemp -d /tmp/irdma-demo.XXXXXX)

irdma local --nodes 3 --replicas 2 --dir "$work" --arena 1GiB >"$work/config-path" 2>"$work/local.log" &
local_pid=$!
cleanup() {
    kill -TERM "$local_pid" 2>/dev/null || true
    wait "$local_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 150); do
    [ -s "$work/config-path" ] && break
    kill -0 "$local_pid" 2>/dev/null || { cat "$work/local.log" >&2; exit 1; }
    sleep 0.2
done
export IRDMA_CONFIG
IRDMA_CONFIG=$(cat "$work/config-path")
echo "== cluster ($IRDMA_CONFIG)"
irdma status

echo "== put a model (.npz, 3 tensors, 40 MB) and get it back"
python - "$work/model.npz" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
np.savez(sys.argv[1], **{"fc1.weight": rng.standard_normal((2048, 4096), dtype=np.float32),
                         "fc1.bias": np.zeros(4096, np.float32),
                         "fc2.weight": rng.standard_normal((4096, 512), dtype=np.float32)})
PY
irdma put demo/model "$work/model.npz"
irdma ls -l demo/
irdma get demo/model -o "$work/back.npz"
python - "$work/model.npz" "$work/back.npz" <<'PY'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
print("round trip: identical")
PY

echo "== the same cluster as files (irdma mount)"
mnt="$work/mnt"
mkdir -p "$mnt"
irdma mount "$mnt"
mounted=1
cleanup_mount() { [ -n "${mounted:-}" ] && fusermount3 -u "$mnt" 2>/dev/null; mounted=; }
trap 'cleanup_mount; cleanup' EXIT
ls -l "$mnt/demo/model/"
getfattr -d "$mnt/demo/model/fc1.weight.npy" 2>/dev/null | grep irdma
python - "$mnt" <<'PY'
import sys, numpy as np
mnt = sys.argv[1]
w = np.load(f"{mnt}/demo/model/fc2.weight.npy")
np.save(f"{mnt}/demo/model/.accumulate/fc2.weight.npy", np.ones_like(w))   # push a "gradient"
assert np.array_equal(np.load(f"{mnt}/demo/model/fc2.weight.npy"), w + 1)
print("np.load / np.save / accumulate through the mount: ok")
PY

echo "== training a CNN on handwritten digits: 4 worker processes, sync mode, the client"
python bench/train_digits.py --config "$IRDMA_CONFIG" --workers 4 --mode sync --via client
echo "== the same model through the mount, np.load/np.save only: 2 workers, ssp mode"
python bench/train_digits.py --config "$IRDMA_CONFIG" --mount "$mnt" --workers 2 --mode ssp \
    --via mount
cleanup_mount

echo "== a daemon hangs (SIGSTOP): the model stays readable and writable, then it catches up"
hung=$(pgrep -f -- "--config $IRDMA_CONFIG --node n2")
kill -STOP "$hung"
python - <<'PY'
import time
import numpy as np
from irdma import Client
with Client(timeout=3) as c:
    t = time.monotonic()
    w = c.read("demo/model/fc2.weight")
    c.accumulate("demo/model/fc2.weight", np.ones_like(w))
    assert np.array_equal(c.read("demo/model/fc2.weight"), w + 1)
    print(f"read, accumulate, read back with n2 hung: ok ({time.monotonic() - t:.1f} s)")
PY
kill -CONT "$hung"
python - <<'PY'
import time
from irdma import Client
with Client() as c:
    n2 = c.config.node("n2")
    for _ in range(300):
        if c.hello(n2).get("ready"):
            print("n2 caught up from its replicas and serves again")
            break
        time.sleep(0.1)
    else:
        raise SystemExit("n2 did not catch up in 30 s")
PY

echo "== benchmark"
irdma bench --size 256MiB
