#!/usr/bin/env bash
# Downloads the optional peers' wheels into .whl/ (git-ignored) for the lent GPU machine, which
# has no network: accelerated-scan, fla-core (ops: chunk_gated_delta_product, chunk_hgrn),
# flash-linear-attention (fla.layers: the GatedDeltaNet layer of benchmarks/layer_targets.py;
# it needs transformers, which the device image has) and einops. Pure-Python wheels.
# Then name ".whl" in the device call's carry list; tools/device_setup.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl accelerated-scan==0.3.1 fla-core==0.6.0 flash-linear-attention==0.6.0 einops==0.8.2
ls -l .whl
