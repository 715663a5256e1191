#!/usr/bin/env bash
# Install what irdma needs on a Debian or Ubuntu machine (run as root), then
# create .venv with irdma installed in it (editable, with test tools).
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# systemd: systemd-analyze and systemd-sysusers for tests/test_deploy.py; fio: the
# mount's verify test (tests/test_fuse_writers.py) and bench/fuse.py; etcd-server:
# the membership tests start their own etcd (tests/helpers/etcd.py).
APT_PACKAGES=(python3 python3-venv python3-dev gcc pkg-config iperf3 procps iproute2
              fuse3 libfuse3-dev attr rsync systemd fio etcd-server)
had_etcd=$(dpkg-query -W -f='${Status}' etcd-server 2>/dev/null || true)
deploy/apt-install.sh "${APT_PACKAGES[@]}"
if [[ "$had_etcd" != *"install ok installed"* ]] && [ -d /run/systemd/system ]; then
    # Debian starts a default single-node etcd on install; irdma's tests and demo
    # start their own, so the distro's is stopped again (the package stays).
    systemctl disable --now etcd >/dev/null 2>&1 || true
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: irdma needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,fuse,train]'
# torch (CPU) for the torch.save/torch.load tests, the torch extra and the
# digits training program (bench/train_digits.py); pinned so
# pip takes the CPU build this machine kind ships instead of a CUDA download.
if [ "${IRDMA_SKIP_TORCH:-0}" != 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
fi
echo "setup: ready ($(.venv/bin/python --version), irdma in $(pwd)/.venv)" >&2
