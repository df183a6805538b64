"""Build the GPU machines' Triton kernel cache on this CPU machine, so a device call spends its
minutes running kernels instead of compiling them (a cold pytest row of a new kernel costs ~50 s
of device time; sixty-ninth / seventieth sessions: device calls are scarce).

How: Triton's JIT, not the interpreter, runs a driver script (``tools/jit_cache_runs.py``) on CPU
tensors with a stand-in driver that reports an sm_90 GPU; every launch compiles (``warmup``) and
launches nothing. The JIT keys each kernel exactly as on the GPU (its own binder, specialisation
and options), and ``triton.compile`` writes the cubin into ``TRITON_CACHE_DIR``. The cache key
also holds ``triton_key()``, a hash of Triton's files, of which only ``libtriton.so`` differs
between this machine's Python (3.11) and the GPU image's (3.12); ``--libtriton`` names the GPU
Python's copy (from the cp312 wheel of the same Triton), whose hash replaces this one's.

    pip install --no-deps --target /tmp/t36 triton==3.6.0                     # compiler (cp311)
    pip download triton==3.6.0 --python-version 3.12 --only-binary=:all: --no-deps -d /tmp/w312
    python -m zipfile -e /tmp/w312/triton-3.6.0-cp312-*.whl /tmp/t312           # its libtriton.so
    PYTHONPATH=/tmp/t36 python tools/jit_cache.py build --libtriton /tmp/t312/triton/_C/libtriton.so \\
        --gpu "NVIDIA H100 80GB HBM3:132" --cache-dir /tmp/jit_cache -- tools/jit_cache_runs.py lbthread
    python tools/jit_cache.py pack --cache-dir /tmp/jit_cache --out .triton_cache   # then carry it

On the device, ``tools/device_setup.sh`` restores ``.triton_cache`` (``tools/triton_cache.sh``);
``python3 tools/jit_cache.py keyinfo`` there and ``... keyinfo --libtriton ...`` here must print
the same line, else every entry misses (a miss only recompiles: it is never a wrong kernel).

``--gpu NAME:SMS`` makes the launch rules that read the GPU's name and SM count
(``kernels/_host.py``) see that GPU, so default paths pick the kernels they pick there. Host code
that asks ``TRITON_INTERPRET`` takes its CPU-tensor branch (the variable is set after the kernel
modules are imported, so they stay JIT functions); where that branch picks other constexprs than a
GPU would, those kernels compile on the device as before.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import pkgutil
import runpy
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sha_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _patch_triton_key(libtriton: str | None) -> None:
    """``triton_key()`` as the GPU image's Triton computes it: this one's with the hash of the
    other Python's ``libtriton.so`` in place of this one's (the .py files are the same)."""
    if not libtriton:
        return
    import sysconfig

    import triton
    import triton.runtime.cache as cache
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    local = _sha_file(os.path.join(os.path.dirname(triton.__file__), "_C", f"libtriton.{ext}"))
    key = cache.triton_key()
    if local not in key:
        raise SystemExit("jit_cache: this Triton's triton_key() does not hold its libtriton hash "
                         "(a Triton whose key is built differently): cannot retarget it")
    key = key.replace(local, _sha_file(libtriton))
    cache.triton_key = lambda: key


def keyinfo(libtriton: str | None) -> str:
    """One line that must match between the device and this machine's build."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    _patch_triton_key(libtriton)
    import triton.runtime.cache as cache
    tk = hashlib.sha256(cache.triton_key().encode()).hexdigest()[:16]
    backend = make_backend(GPUTarget("cuda", 90, 32)).hash()
    backend = hashlib.sha256(backend.encode()).hexdigest()[:16] + " (" + " ".join(backend.split())[-40:] + ")"
    return (f"triton {triton.__version__} key {tk} backend {backend}"
            f" env {sorted(get_cache_invalidating_env_vars().items())}")


class _StandInDriver:
    """Enough of a driver for ``JITFunction.run`` to bind, key and compile for sm_90."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def is_active(self):
        return True


def _import_kernel_modules() -> int:
    """Import every module of the package before TRITON_INTERPRET is set: their ``@triton.jit``
    functions must be JIT functions, not interpreted ones."""
    n = 0
    for pkg_name in ("lrnn_scan", "lrnn_scan.kernels", "lrnn_scan.models"):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if ".tests" in info.name or info.name.endswith("__main__"):
                continue
            importlib.import_module(info.name)
            n += 1
    return n


def _fake_gpu(spec: str) -> None:
    """``NAME:SMS``: ``_host.num_sms`` / ``device_name`` answer for that GPU, in every module
    that imported them by name."""
    name, _, sms = spec.rpartition(":")
    if not name or not sms.isdigit():
        raise SystemExit(f"--gpu {spec!r}: expected NAME:SMS, e.g. 'NVIDIA H100 80GB HBM3:132'")
    from lrnn_scan.kernels import _host
    orig = {"num_sms": _host.num_sms, "device_name": _host.device_name}
    fakes = {"num_sms": lambda device, cpu=8: int(sms), "device_name": lambda device: name}
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("lrnn_scan"):
            for attr, fn in orig.items():
                if getattr(mod, attr, None) is fn:
                    setattr(mod, attr, fakes[attr])


def _gpu_host_rules() -> None:
    """Host rules that ask ``TRITON_INTERPRET`` for another reason than the device: decide as on
    the GPU. The delta kernels take 16-bit ``Q K^T`` operands as they are (``function._raw``);
    only the interpreter's wrong bf16 dot made it convert them."""
    import torch
    fn = sys.modules.get("lrnn_scan.kernels.delta_product.function")
    if fn is not None:
        fn._raw = lambda x: x.dtype in (torch.float16, torch.bfloat16)


def build(cache_dir: str, libtriton: str | None, gpu: str | None, script: list[str]) -> int:
    os.makedirs(cache_dir, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = os.path.abspath(cache_dir)
    os.environ["TRITON_STORE_BINARY_ONLY"] = "1"  # as tools/device_setup.sh: cubin + metadata
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    _patch_triton_key(libtriton)
    driver.set_active(_StandInDriver())
    if ROOT not in sys.path:
        sys.path.append(ROOT)  # after PYTHONPATH, so the compiler Triton wins
    n = _import_kernel_modules()
    if gpu:
        _fake_gpu(gpu)
    stats = {"hit": 0, "miss": 0, "secs": 0.0, "names": {}}

    def listener(src, metadata, metadata_group, times, cache_hit):
        stats["hit" if cache_hit else "miss"] += 1
        stats["names"][src.name] = stats["names"].get(src.name, 0) + (0 if cache_hit else 1)

    knobs.compilation.listener = listener
    orig_run = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):  # compile, never launch
        t0 = time.time()
        out = orig_run(self, *args, grid=grid, warmup=True, **kwargs)
        stats["secs"] += time.time() - t0
        return out

    JITFunction.run = run
    os.environ["TRITON_INTERPRET"] = "1"  # host checks: CPU tensors may take the kernel paths
    _gpu_host_rules()
    print(f"[jit_cache] triton {triton.__version__} ({os.path.dirname(triton.__file__)}); {n} modules;"
          f" {keyinfo(None)}", flush=True)
    sys.argv = list(script)
    try:
        runpy.run_path(script[0], run_name="__main__")
    finally:
        JITFunction.run = orig_run
        print(f"[jit_cache] {stats['miss']} compiled, {stats['hit']} already cached, {stats['secs']:.0f} s;"
              f" by kernel: {stats['names']}", flush=True)
    return 0


def pack(cache_dir: str, out: str) -> int:
    """``cache_dir``'s entries into ``out/triton_cache.tar.gz`` (what ``triton_cache.sh restore``
    unpacks into the device's cache)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "triton_cache.tar.gz")
    entries = sorted(e for e in os.listdir(cache_dir) if os.path.isdir(os.path.join(cache_dir, e)))
    with tarfile.open(path, "w:gz") as tar:
        for e in entries:
            tar.add(os.path.join(cache_dir, e), arcname=e)
    print(f"[jit_cache] {len(entries)} entries -> {path} ({os.path.getsize(path) // 1024} KiB)")
    return 0


def main() -> int:
    argv = sys.argv[1:]
    script = []
    if "--" in argv:
        i = argv.index("--")
        argv, script = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("build", help="run a driver script through the JIT: compile every launch into the cache")
    b.add_argument("--cache-dir", required=True)
    b.add_argument("--libtriton", help="the GPU Python's libtriton.so (same Triton version)")
    b.add_argument("--gpu", help="NAME:SMS the launch rules see, e.g. 'NVIDIA H100 80GB HBM3:132'")
    p = sub.add_parser("pack", help="archive a cache dir for tools/triton_cache.sh restore")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--out", default=".triton_cache")
    k = sub.add_parser("keyinfo", help="the key parts that must match the device's")
    k.add_argument("--libtriton")
    a = ap.parse_args(argv)
    if a.mode == "keyinfo":
        print("[jit_cache]", keyinfo(a.libtriton))
        return 0
    if a.mode == "pack":
        return pack(a.cache_dir, a.out)
    if not script:
        raise SystemExit("build: give the driver script after '--', e.g. -- tools/jit_cache_runs.py lbthread")
    return build(a.cache_dir, a.libtriton, a.gpu, script)


if __name__ == "__main__":
    sys.exit(main())
