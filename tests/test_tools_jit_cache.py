"""tools/jit_cache.py: the GPU's Triton kernel cache built on a CPU machine (the JIT, a stand-in
sm_90 driver, no launches). Runs with this machine's Triton (the device build uses 3.6)."""
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = str(ROOT / "tools" / "jit_cache.py")


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the tool sets it itself
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    return r.returncode, r.stdout + r.stderr


def _counts(out):
    m = re.search(r"\[jit_cache\] (\d+) compiled, (\d+) already cached", out)
    assert m, out[-2000:]
    return int(m.group(1)), int(m.group(2))


def test_build_fills_the_cache_then_hits_it(tmp_path):
    """A first build compiles the default m = 2 forward's kernel(s) into the cache dir; a second
    build of the same launches compiles nothing (every key found); pack archives the entries."""
    cache = tmp_path / "cache"
    drive = ["--", "tools/jit_cache_runs.py", "tune", "--m", "2", "--shapes", "1x8x4"]
    rc, out = _run("build", "--cache-dir", str(cache), "--gpu", "NVIDIA H100 80GB HBM3:132", *drive)
    assert rc == 0, out[-3000:]
    compiled, cached = _counts(out)
    assert compiled >= 1 and cached == 0, out[-2000:]
    assert list(cache.glob("*/*.cubin")), "no cubin in the cache"
    rc, out = _run("build", "--cache-dir", str(cache), "--gpu", "NVIDIA H100 80GB HBM3:132", *drive)
    assert rc == 0 and _counts(out) == (0, compiled), out[-2000:]
    rc, out = _run("pack", "--cache-dir", str(cache), "--out", str(tmp_path / "carry"))
    assert rc == 0, out
    with tarfile.open(tmp_path / "carry" / "triton_cache.tar.gz") as tar:
        names = tar.getnames()
    assert {n.split("/")[0] for n in names} == {p.name for p in cache.iterdir()}
    assert any(n.endswith(".cubin") for n in names)


def test_keyinfo_retargets_the_libtriton_hash(tmp_path):
    """--libtriton replaces this Triton's libtriton hash in the key: the same file gives the same
    key, another file another key (the GPU Python's copy)."""
    import triton
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    own = Path(triton.__file__).parent / "_C" / f"libtriton.{ext}"
    other = tmp_path / "libtriton.so"
    other.write_bytes(b"another build")
    outs = [_run("keyinfo", *a) for a in ([], ["--libtriton", str(own)], ["--libtriton", str(other)])]
    assert all(rc == 0 for rc, _ in outs), outs
    keys = [re.search(r" key (\w+) ", o).group(1) for _, o in outs]
    assert keys[0] == keys[1] != keys[2], keys


def test_bad_gpu_spec(tmp_path):
    rc, out = _run("build", "--cache-dir", str(tmp_path), "--gpu", "H100", "--",
                   "tools/jit_cache_runs.py", "tune", "--m", "2", "--shapes", "1x8x4")
    assert rc != 0 and "expected NAME:SMS" in out, out[-1000:]


@pytest.mark.parametrize("argv", [["build", "--cache-dir", "x"]])
def test_build_needs_a_driver_script(argv):
    rc, out = _run(*argv)
    assert rc != 0 and "give the driver script" in out, out[-1000:]
