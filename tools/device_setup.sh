# Source at the start of a command on the lent GPU machine (device tool), from the repo root:
#   source tools/device_setup.sh   (carry .whl for the optional peers: bash tools/fetch_peer_wheels.sh,
#   and .triton_cache for the kernels an earlier call compiled: tools/triton_cache.sh)
# Installs lrnn_scan editable with the image's torch python (plain 'pip' there is another Python),
# keeps NVLink multicast off, prints GPU / torch / Triton versions.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -e . --no-deps --no-build-isolation -q 2>&1 | grep -v WARNING | tail -2
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
# cache only cubin + metadata (no TTIR/TTGIR/LLIR/PTX text): the saved cache of 2026-11-25's first call
# was 21 MiB compressed with the IR, over the 16 MiB a returned file may have
export TRITON_STORE_BINARY_ONLY=${TRITON_STORE_BINARY_ONLY:-1}
bash tools/triton_cache.sh restore      # a carried .triton_cache/ (tools/triton_cache.sh) skips recompiles
# the key parts a CPU-built cache (tools/jit_cache.py) must match; printed here to compare
python3 tools/jit_cache.py keyinfo 2>/dev/null || echo "jit_cache keyinfo failed"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__,'gpus',torch.cuda.device_count())"
if ! python3 -c "import lrnn_scan.models, lrnn_scan.kernels, lrnn_scan.mad_tasks" 2>/dev/null; then
  # fallback without setuptools: a shim package of symlinks (edits in the tree stay visible)
  echo "editable install failed; using the symlink shim in /tmp/shim"
  mkdir -p /tmp/shim/lrnn_scan
  for f in $PWD/lrnn_scan/*; do ln -sfn $f /tmp/shim/lrnn_scan/; done
  for d in kernels models mad_tasks; do ln -sfn $PWD/$d /tmp/shim/lrnn_scan/$d; done
  export PYTHONPATH=/tmp/shim:$PYTHONPATH
fi
python3 -c "import lrnn_scan.models, lrnn_scan.kernels, lrnn_scan.mad_tasks; print('lrnn_scan importable from', lrnn_scan.__file__)" || echo "!!! lrnn_scan not importable"
