#!/bin/sh
# What bench/gpu_check.py carries to a GPU machine that has python3.12, torch,
# numpy and safetensors but not irdma's other dependencies, and no network:
# their wheels and the digits data (scikit-learn is not there either), in
# .gpu-wheels/ (git-ignored). irdma itself runs from the tree it is carried with. Run it here, from
# the repository root, with the worktree's virtualenv:
#
#     sh bench/gpu_wheels.sh            # then carry .gpu-wheels to the device
#
# The device then runs `python3 bench/gpu_check.py`, which installs these with
# `pip install --no-index --no-deps --target .gpu-site` (no index, nothing else).
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=.gpu-wheels
rm -rf "$OUT"
mkdir -p "$OUT"
# irdma's dependencies the device lacks (numpy, safetensors and torch are
# there), and trio's own; --no-deps: exactly these, no second numpy.
"$PY" -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$OUT" \
    "trio>=0.25" attrs sortedcontainers idna outcome sniffio \
    "h11>=0.14" "prometheus-client>=0.20" "tqdm>=4.60" "ml_dtypes>=0.5"
# The digits, as bench/train_digits.py loads and shuffles them.
"$PY" - "$OUT/digits.npz" <<'PYEOF'
import sys

import numpy as np

sys.path.insert(0, "bench")
from train_digits import load_data

x_train, y_train, x_test, y_test = load_data()
np.savez(sys.argv[1], x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
PYEOF
ls -l "$OUT"
du -sh "$OUT"
