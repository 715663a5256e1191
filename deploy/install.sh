#!/usr/bin/env bash
# Install irdma as systemd services on a Debian or Ubuntu host (as root, from
# a clone of this repository):
#   - a virtualenv at $VENV (default /opt/irdma/.venv) with irdma and its FUSE
#     extra installed (not editable: the clone may go away afterwards), so the
#     executables are /opt/irdma/.venv/bin/psd and /opt/irdma/.venv/bin/irdma;
#     it sees the system's site directories, for the distribution's pyverbs;
#   - psd@.service and irdma-mount.service in /etc/systemd/system, pointed at
#     that venv;
#   - the irdma system user and group (/etc/sysusers.d/irdma.conf);
#   - /etc/irdma/cluster.toml from deploy/cluster.toml.example, if there is none.
# It enables nothing; it prints what to run next. Safe to run again.
#
# Environment: PREFIX (default /opt/irdma), VENV (default $PREFIX/.venv).
# DESTDIR=DIR stages the files under DIR instead (no packages, no venv, no
# user, no systemctl): for packaging, and for tests/test_deploy.py, which
# verifies the staged units against its own venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=${PREFIX:-/opt/irdma}
VENV=${VENV:-$PREFIX/.venv}
DESTDIR=${DESTDIR:-}
UNIT_DIR=/etc/systemd/system

if [ -z "$DESTDIR" ]; then
    deploy/apt-install.sh python3 python3-venv python3-dev gcc pkg-config fuse3 libfuse3-dev systemd
    # --system-site-packages: the RDMA transport's pyverbs must match the
    # host's rdma-core, so it comes from the distribution (apt-get install
    # python3-pyverbs), never from PyPI; a venv without the system's site
    # directories could not import it and rdma:// daemons would serve TCP only.
    # irdma's own dependencies are still installed into the venv by pip.
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv --system-site-packages "$VENV"
    else  # a venv made by an earlier install.sh
        sed -i 's/^include-system-site-packages = false$/include-system-site-packages = true/' \
            "$VENV/pyvenv.cfg"
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade '.[fuse]'
fi

install -d "$DESTDIR$UNIT_DIR" "$DESTDIR/etc/sysusers.d" "$DESTDIR/etc/irdma"
for unit in psd@.service irdma-mount.service; do
    sed "s#/opt/irdma/.venv#$VENV#g" "deploy/$unit" >"$DESTDIR$UNIT_DIR/$unit"
    chmod 0644 "$DESTDIR$UNIT_DIR/$unit"
done
install -m 0644 deploy/irdma.sysusers.conf "$DESTDIR/etc/sysusers.d/irdma.conf"
if [ ! -e "$DESTDIR/etc/irdma/cluster.toml" ]; then
    install -m 0644 deploy/cluster.toml.example "$DESTDIR/etc/irdma/cluster.toml"
    echo "install: wrote /etc/irdma/cluster.toml from the example: edit its [[nodes]]" >&2
fi

if [ -z "$DESTDIR" ]; then
    if command -v systemd-sysusers >/dev/null; then
        systemd-sysusers /etc/sysusers.d/irdma.conf
    elif ! id irdma >/dev/null 2>&1; then
        useradd --system --home-dir /var/lib/irdma --no-create-home --shell /usr/sbin/nologin irdma
    fi
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload
    fi
    cat >&2 <<EOF
install: irdma is in $VENV (psd, irdma). Next:
  edit /etc/irdma/cluster.toml (the same file on every host)
  $VENV/bin/irdma doctor                 # what would break RDMA, FUSE, memlock here
  systemctl enable --now psd@NAME        # for each node whose address is this host's
  systemctl enable --now irdma-mount     # /mnt/params, after the daemons
EOF
fi
