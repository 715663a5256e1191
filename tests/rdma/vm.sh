#!/usr/bin/env bash
# vm.sh: run a command inside a qemu guest that has a real RDMA device
# (soft-RoCE, rdma_rxe), with this repository shared in read-only at /src.
#
# The host kernel here has no RDMA; a Debian bookworm guest with its stock
# kernel has rdma_rxe. The guest image (debootstrap, rdma-core, pyverbs,
# perftest, and irdma's Python dependencies pinned to the host .venv's
# versions) is built once and cached outside the repository, keyed by its
# package lists; a boot under qemu TCG (KVM cannot boot it on these hosts)
# takes ~25 s.
#
# Usage: tests/rdma/vm.sh build
#        tests/rdma/vm.sh run RESULTS_DIR      (runs RESULTS_DIR/cmd.sh in the guest)
# The guest sees RESULTS_DIR read-write at /results and this repository
# read-only at /src; tests/rdma/guest.sh sets up soft-RoCE (rxe0 on
# 198.18.0.1, MTU 9000; rxe1 on 198.18.1.1, MTU 1500) and runs cmd.sh. The
# output goes to /results/guest.log and the exit code to /results/rc; this
# script exits with that code, or 90+ when the VM itself failed.
#
# Two ways to boot the same image (GUEST_INIT): "minimal" (the default), a
# tiny shell script as PID 1 that runs guest.sh and powers off; or "systemd",
# systemd as PID 1 (for tests/systemd: the units of deploy/ for real), where
# the enabled oneshot irdma-vm-test.service runs guest.sh once the system is
# up and powers off when it ends.
# Env: IRDMA_VM_CACHE (default /var/cache/irdma/rdma-vm), MTU (9000),
#      MEM (3072), SMP (2), QEMU_TIMEOUT (1500 s), GUEST_INIT (minimal),
#      VM_WAIT (0 s: how long to wait for another qemu guest on this host to
#      finish before booting; two TCG guests on a small host starve each other).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ACTION=${1:-}
MTU=${MTU:-9000}; MEM=${MEM:-3072}; SMP=${SMP:-2}; QEMU_TIMEOUT=${QEMU_TIMEOUT:-1500}
log() { echo "[vm.sh $(date +%T)] $*" >&2; }

# What the image holds; the cache key is derived from these lines.
IMAGE_VERSION=5
# systemd, systemd-sysv: PID 1 for GUEST_INIT=systemd; fuse3: irdma-mount.service.
GUEST_DEBS=linux-image-amd64,initramfs-tools,kmod,udev,iproute2,procps,util-linux,rdma-core,ibverbs-providers,ibverbs-utils,rdmacm-utils,perftest,python3,python3-pyverbs,systemd,systemd-sysv,fuse3,libfuse3-3
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || { log "no $PY: run deploy/setup.sh first"; exit 94; }
pins() {  # irdma's dependencies, its FUSE extra and the test tools, at the host .venv's versions
  "$PY" - <<'PYEOF'
from importlib.metadata import PackageNotFoundError, distribution
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

todo = [Requirement(r) for r in distribution("irdma").requires or []]
todo = [r for r in todo if not r.marker or r.marker.evaluate({"extra": ""})]
todo += [Requirement(n) for n in ("pyfuse3", "pytest", "pytest-trio", "pytest-timeout", "hypothesis")]
seen = {}
while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if name in seen:
        continue
    try:
        dist = distribution(req.name)
    except PackageNotFoundError:
        continue
    seen[name] = dist.version
    for sub in dist.requires or []:
        r = Requirement(sub)
        if not r.marker or r.marker.evaluate({"extra": ""}):
            todo.append(r)
for name in sorted(seen):
    print(f"{name}=={seen[name]}")
PYEOF
}
PINS=$(pins)
KEY=$(printf '%s\n%s\n%s\n' "$IMAGE_VERSION" "$GUEST_DEBS" "$PINS" | sha256sum | cut -c1-16)
D=${IRDMA_VM_CACHE:-/var/cache/irdma/rdma-vm}/$KEY
ROOT=$D/rootfs

host_deps() {
  "$REPO/deploy/apt-install.sh" qemu-system-x86 debootstrap e2fsprogs cpio busybox-static
}

mirror() {  # the Debian mirror this host's apt already uses
  { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } |
    sed -n 's/^URIs: *\([^ ]*\).*/\1/p; s/^deb  *\(http[^ ]*\).*/\1/p' | head -1
}

build_rootfs() {
  rm -rf "$ROOT"; mkdir -p "$D"
  log "debootstrap bookworm minbase -> $ROOT (once per package list)"
  local m; m=$(mirror); m=${m:-http://deb.debian.org/debian}
  debootstrap --variant=minbase --include="$GUEST_DEBS" bookworm "$ROOT" "$m" \
    > "$D/debootstrap.log" 2>&1 || { tail -20 "$D/debootstrap.log" >&2; exit 91; }
  log "pip: irdma's dependencies for the guest's Python"
  # Same interpreter version and architecture as the host, so the host's pip
  # can install into the guest's site directory.
  echo "$PINS" > "$D/requirements.txt"
  "$PY" -m pip install -q --disable-pip-version-check \
    --target "$ROOT/usr/local/lib/python3.11/dist-packages" -r "$D/requirements.txt" \
    || exit 91
  local K; K=$(ls "$ROOT/lib/modules" | head -1)
  rm -rf "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
    "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* \
    "$ROOT"/usr/share/locale/* "$ROOT"/boot/initrd.img-*
  local M=$ROOT/lib/modules/$K/kernel
  find "$M/drivers" -mindepth 1 -maxdepth 1 -type d \
    ! -name virtio ! -name block ! -name net ! -name infiniband ! -name char -exec rm -rf {} +
  find "$M/drivers/net" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
  rm -rf "$M/sound" "$M/net/wireless" "$M/net/mac80211" "$M/net/bluetooth"
  chroot "$ROOT" depmod "$K"
  mkdir -p "$ROOT/src" "$ROOT/results"
  install_guest_init
}

install_guest_init() {
  # Kept minimal, so the guest's setup (tests/rdma/guest.sh, read from the
  # share) can change without rebuilding the image.
  cat > "$ROOT/sbin/irdma-vm-init" <<'INIT'
#!/bin/sh
# PID 1 after switch_root: mount the shares, run /src/tests/rdma/guest.sh, power off.
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t tmpfs tmp /tmp
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs shm /dev/shm
o=trans=virtio,version=9p2000.L,msize=524288
if mount -t 9p -o $o,ro src /src && mount -t 9p -o $o results /results; then
  sh /src/tests/rdma/guest.sh > /results/guest.log 2>&1
  rc=$?
else
  rc=97
fi
echo "$rc" > /results/rc
sync; umount /results
echo "IRDMA_VM_DONE rc=$rc"
echo o > /proc/sysrq-trigger
sleep 10
INIT
  chmod +x "$ROOT/sbin/irdma-vm-init"
  install_systemd_test_unit
}

install_systemd_test_unit() {
  # GUEST_INIT=systemd: the same job as irdma-vm-init, as a unit started once
  # the system is up. SuccessAction/FailureAction power off without stopping
  # the other units one by one (a daemon left running would write its final
  # snapshot first).
  cat > "$ROOT/sbin/irdma-vm-systemd-run" <<'RUN'
#!/bin/sh
# ExecStart of irdma-vm-test.service: mount the shares, run /src/tests/rdma/guest.sh.
o=trans=virtio,version=9p2000.L,msize=524288
if mount -t 9p -o $o,ro src /src && mount -t 9p -o $o results /results; then
  sh /src/tests/rdma/guest.sh > /results/guest.log 2>&1
  rc=$?
else
  rc=97
fi
echo "$rc" > /results/rc
sync; umount /results
echo "IRDMA_VM_DONE rc=$rc"
RUN
  chmod +x "$ROOT/sbin/irdma-vm-systemd-run"
  local S=$ROOT/etc/systemd/system
  cat > "$S/irdma-vm-test.service" <<'UNIT'
[Unit]
Description=irdma VM test: /src/tests/rdma/guest.sh, then power off
After=basic.target systemd-udevd.service
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/sbin/irdma-vm-systemd-run
Environment=HOME=/root PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
TimeoutStartSec=infinity
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
UNIT
  mkdir -p "$S/multi-user.target.wants"
  ln -sf ../irdma-vm-test.service "$S/multi-user.target.wants/irdma-vm-test.service"
  # Nothing logs in; no D-Bus (systemctl reaches PID 1 on its private socket),
  # so no logind; no periodic jobs. Each would cost seconds under TCG.
  local u
  for u in getty@.service serial-getty@.service getty-static.service systemd-logind.service apt-daily.timer \
           apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
           systemd-firstboot.service; do
    ln -sf /dev/null "$S/$u"
  done
  echo irdma-vm > "$ROOT/etc/hostname"
  # A fixed machine id: not a first boot (no systemd-firstboot prompts).
  echo 3f9a1c5e7b2d4f6081a3c5e7092b4d6f > "$ROOT/etc/machine-id"
}

build_initramfs() {  # static busybox and the modules for virtio, ext4 and 9p
  local K T; K=$(ls "$ROOT/lib/modules" | head -1); T=$(mktemp -d)
  mkdir -p "$T"/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox "$T/bin/busybox"
  : > "$T/modules.order"
  for m in virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p; do
    chroot "$ROOT" modprobe -S "$K" --show-depends $m | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r p; do
    cp "$ROOT$p" "$T/lib/modules/"; basename "$p" >> "$T/modules.order"
  done
  cat > "$T/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /lib/modules/$m 2>/dev/null; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mount -t ext4 /dev/vda /newroot || { echo "IRDMA_VM_DONE rc=98 (root mount)"; echo o > /proc/sysrq-trigger; }
# irdma.init=systemd on the kernel command line: systemd as PID 1.
INIT=/sbin/irdma-vm-init
for a in $(cat /proc/cmdline); do [ "$a" = irdma.init=systemd ] && INIT=/lib/systemd/systemd; done
mount --move /dev /newroot/dev; umount /proc /sys
exec switch_root /newroot $INIT
INIT
  chmod +x "$T/init"
  (cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) > "$D/initramfs.cpio.gz"
  rm -rf "$T"
}

build_image() {
  local sz; sz=$(du -sm "$ROOT" | cut -f1); sz=$((sz * 13 / 10 + 300))
  rm -f "$D/rootfs.ext4"
  truncate -s ${sz}M "$D/rootfs.ext4"
  mkfs.ext4 -q -F -L irdmaroot -d "$ROOT" "$D/rootfs.ext4"
}

build() {
  [ -f "$D/.done" ] && return 0
  host_deps
  local t0=$SECONDS
  # Built under a lock: two test runs may start at once.
  mkdir -p "$D"
  exec 9> "$D/.lock"; flock 9
  [ -f "$D/.done" ] && return 0
  build_rootfs; build_initramfs; build_image
  touch "$D/.done"
  log "guest image built in $((SECONDS - t0)) s: $D"
}

wait_for_other_guests() {
  local waited=0 limit=${VM_WAIT:-0}
  while pgrep -f qemu-system-x86_64 >/dev/null; do
    if [ "$waited" -ge "$limit" ]; then
      [ "$limit" -gt 0 ] && log "another qemu guest still runs after ${limit} s; booting anyway"
      return 0
    fi
    [ "$waited" -eq 0 ] && log "another qemu guest runs here (pid $(pgrep -f qemu-system-x86_64 | head -1)); waiting up to ${limit} s"
    sleep 20; waited=$((waited + 20))
  done
}

run_vm() {
  local results=$1
  [ -f "$results/cmd.sh" ] || { log "missing $results/cmd.sh"; exit 92; }
  local K; K=$(ls "$ROOT/boot" | grep '^vmlinuz-' | head -1)
  rm -f "$results/rc" "$results/guest.log"
  # no_timer_check: the kernel's boot-time check that the IO-APIC timer ticks fails
  # under emulation on a busy host ("IO-APIC + timer doesn't work!", a panic seen
  # with two busy loops running); virtual machines skip it.
  local append="console=ttyS0 panic=-1 quiet no_timer_check irdma.mtu=$MTU"
  case ${GUEST_INIT:-minimal} in
    minimal) ;;
    systemd) append="$append irdma.init=systemd systemd.show_status=1" ;;
    *) log "GUEST_INIT=$GUEST_INIT: minimal or systemd"; exit 2 ;;
  esac
  wait_for_other_guests
  log "booting the guest (qemu TCG, ${SMP} vCPUs, ${MEM} MiB, MTU $MTU, init ${GUEST_INIT:-minimal})"
  local t0=$SECONDS
  timeout "$QEMU_TIMEOUT" qemu-system-x86_64 -machine q35,accel=tcg -cpu max \
    -smp "$SMP" -m "$MEM" -nographic -no-reboot -monitor none -nic none \
    -kernel "$ROOT/boot/$K" -initrd "$D/initramfs.cpio.gz" \
    -append "$append" \
    -drive "file=$D/rootfs.ext4,if=virtio,format=raw,snapshot=on" \
    -virtfs "local,path=$REPO,mount_tag=src,security_model=none,readonly=on,id=src" \
    -virtfs "local,path=$results,mount_tag=results,security_model=none,id=results" \
    </dev/null > "$results/serial.log" 2>&1 || true
  log "guest finished after $((SECONDS - t0)) s"
  if [ -f "$results/rc" ]; then exit "$(cat "$results/rc")"; fi
  log "no exit code from the guest; last serial lines:"; tail -20 "$results/serial.log" >&2
  exit 93
}

case $ACTION in
  build) build ;;
  run) [ $# -eq 2 ] || { echo "usage: $0 run RESULTS_DIR" >&2; exit 2; }
       build; run_vm "$(cd "$2" && pwd)" ;;
  path) echo "$D" ;;
  *) echo "usage: $0 build | run RESULTS_DIR | path" >&2; exit 2 ;;
esac
