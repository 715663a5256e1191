#!/usr/bin/env bash
# Install the peers bench/compare.py measures irdma against, on Debian or
# Ubuntu, as root: Redis, OpenMPI, iperf3 (apt) and redis, hiredis, mpi4py,
# matplotlib (pip, into .venv). Runs deploy/setup.sh first for irdma itself.
# Safe to run again: it installs only what is missing. Kept apart from
# deploy/setup.sh because the test suite needs none of this.
#
#     sudo bench/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/setup.sh

APT_PACKAGES=(redis-server openmpi-bin libopenmpi-dev iperf3)
deploy/apt-install.sh "${APT_PACKAGES[@]}"
# The package may start a system Redis on 6379; the benchmark starts its own
# on a free port and leaves the system one alone.

PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# Python module name -> pip requirement.
declare -A PY_PACKAGES=([redis]=redis [hiredis]=hiredis [matplotlib]=matplotlib)
for mod in "${!PY_PACKAGES[@]}"; do
    if ! .venv/bin/python -c "import $mod" 2>/dev/null; then
        echo "bench setup: pip install ${PY_PACKAGES[$mod]}" >&2
        "${PIP[@]}" "${PY_PACKAGES[$mod]}"
    fi
done
# mpi4py is built from source against the system's mpicc, so it uses the
# OpenMPI that mpirun starts (a prebuilt wheel may expect another MPI).
if ! .venv/bin/python -c "from mpi4py import MPI" 2>/dev/null; then
    echo "bench setup: building mpi4py against $(command -v mpicc)" >&2
    "${PIP[@]}" --no-binary=mpi4py mpi4py
fi
echo "bench setup: ready (redis-server, mpirun, iperf3, redis-py, mpi4py, matplotlib)" >&2
