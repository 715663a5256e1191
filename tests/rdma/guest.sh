#!/bin/sh
# Runs inside the soft-RoCE guest (tests/rdma/vm.sh): bring up two rxe
# devices, then run /results/cmd.sh with irdma importable from /src.
set -u
MTU=9000
for a in $(cat /proc/cmdline); do case $a in irdma.mtu=*) MTU=${a#irdma.mtu=};; esac; done
ip link set lo up
modprobe rdma_rxe || exit 10
# dummy netdevs (not dummy0: the module creates that one itself)
ip link add rxe_if type dummy && ip link set rxe_if mtu "$MTU" up &&
  ip addr add 198.18.0.1/24 dev rxe_if && rdma link add rxe0 type rxe netdev rxe_if || exit 11
# a second device at MTU 1500 (active MTU 1024), for the MTU checks
ip link add rxe_if2 type dummy && ip link set rxe_if2 mtu 1500 up &&
  ip addr add 198.18.1.1/24 dev rxe_if2 && rdma link add rxe1 type rxe netdev rxe_if2 || exit 12
ulimit -l unlimited
# The project's import names (pyproject maps psd/ and fuse/ to these).
mkdir -p /tmp/py && ln -s /src/psd /tmp/py/irdma_psd && ln -s /src/fuse /tmp/py/irdma_fuse
# /src is read-only: bytecode is cached in the guest's /tmp (imports cost
# seconds each under TCG when every process compiles them again).
export PYTHONPATH=/tmp/py:/src PYTHONPYCACHEPREFIX=/tmp/pycache
# /src is read-only: hypothesis keeps its example database elsewhere.
export HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis
# Everything runs several times slower under qemu's emulation.
export IRDMA_TEST_READY_TIMEOUT=90
echo "guest: $(uname -r), $(nproc) CPUs, rdma: $(rdma link show | tr '\n' ' ')"
cd /src && sh /results/cmd.sh
