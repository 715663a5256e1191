#!/bin/sh
# Runs in the qemu guest booted with systemd as PID 1 (tests/rdma/vm.sh with
# GUEST_INIT=systemd; its irdma-vm-test.service runs tests/rdma/guest.sh,
# which sets up soft-RoCE on 198.18.0.1 and runs /results/cmd.sh, which runs
# this). Installs irdma as deploy/install.sh lays it out, then runs the
# checks of tests/systemd/guest_checks.py against the units of deploy/.
set -eu
VENV=/opt/irdma/.venv
say() { echo "[guest_run $(date +%T)] $*"; }

if [ "$(cat /proc/1/comm)" != systemd ]; then
    say "PID 1 is $(cat /proc/1/comm), not systemd: boot with GUEST_INIT=systemd"
    exit 20
fi
say "systemd $(systemctl --version | head -1 | cut -d' ' -f2), system state: $(systemctl is-system-running || true)"

# guest.sh points Python at /src with a bytecode cache in /tmp, for the RDMA
# suite; here everything runs from the installed venv, as on a real host.
unset PYTHONPATH PYTHONPYCACHEPREFIX

# irdma itself: no network in the guest, so not pip (see install_offline.py).
say "installing irdma into $VENV"
python3 /src/tests/systemd/install_offline.py /src "$VENV"

# The cluster: three daemons on the soft-RoCE address, over rdma://, two
# copies of each shard (a daemon that was down catches up from the others).
# Written before install.sh, which keeps an existing config.
install -d -m 0755 /etc/irdma
cat >/etc/irdma/cluster.toml <<'EOF'
shard_size = "64KiB"
replicas = 2
timeout = 20.0
heartbeat = 0.2
failure_timeout = 1.0
snapshot_interval = 0      # snapshots only at stop: the one found after a stop was written by it
log_level = "INFO"
secret_file = "/etc/irdma/secret"

[[nodes]]
name = "n1"
address = "rdma://198.18.0.1:7401"
arena_size = "64MiB"

[[nodes]]
name = "n2"
address = "rdma://198.18.0.1:7402"
arena_size = "64MiB"

[[nodes]]
name = "n3"
address = "rdma://198.18.0.1:7403"
arena_size = "64MiB"
EOF

# The units, the sysusers entry (and the config, kept): exactly what
# install.sh writes. DESTDIR=/ stages into the real root and skips what needs
# the network (apt, pip); the user and daemon-reload are its remaining steps.
say "deploy/install.sh with DESTDIR=/ VENV=$VENV"
DESTDIR=/ VENV="$VENV" bash /src/deploy/install.sh
systemd-sysusers /etc/sysusers.d/irdma.conf
id irdma
# The shared secret: readable by the daemons' group, by no one else.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >/etc/irdma/secret
chown root:irdma /etc/irdma/secret
chmod 0640 /etc/irdma/secret
systemctl daemon-reload
grep -n '^ExecStart=' /etc/systemd/system/psd@.service /etc/systemd/system/irdma-mount.service
ls -l /dev/infiniband/ || true

say "checks"
exec "$VENV/bin/python" /src/tests/systemd/guest_checks.py /results/checks.json
