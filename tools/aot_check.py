"""Ahead-of-time compile check: catch kernels that fail to compile (or spill) on sm_90 with the GPU
machines' Triton (3.6) on this CPU-only machine, before any GPU time is spent.

Step 1, with the local Triton (interpreter), record every distinct kernel launch of a test run::

    python tools/aot_check.py record --out /tmp/aot_launches.json [-- PYTEST ARGS...]

Step 2, with Triton 3.6 first on the path, compile each recorded launch for sm_90a and run ptxas -v::

    PYTHONPATH=/tmp/t36 python tools/aot_check.py compile --launches /tmp/aot_launches.json

/tmp/t36 comes from ``pip install --no-deps --target /tmp/t36 triton==3.6.0`` (the wheel bundles
ptxas; no GPU or CUDA driver is needed to compile). ``compile`` exits 1 if any launch failed to
compile, timed out or needs more shared memory than an H100 block can have.

How the hook works: under ``TRITON_INTERPRET=1`` ``@triton.jit`` returns an
``InterpretedFunction`` and every launch ``kernel[grid](...)`` goes through
``InterpretedFunction.run(*args, grid=..., warmup=..., **kwargs)`` (device-function calls use
``__call__`` and are not launches). ``record`` wraps that method on the class, binds the arguments
to the kernel's signature and reduces each one as the GPU JIT would (``native_specialize_impl``:
``*bf16``/``i32``/``i64``/``fp32``/``u1``, 16-byte alignment -> ``tt.divisibility`` 16, int 1 and
None -> constexpr, ``do_not_specialize`` respected), so two launches that differ only in runtime
int values share one entry, exactly like the GPU kernel cache.

``compile`` also disassembles each cubin (the wheel's ``nvdisasm``) and reports the largest loop
(the longest backward branch): its instruction count, barriers (``BAR.SYNC``) and selects
(``SEL``/``FSEL``). For a loop that runs one time step a trip (or m of them, unrolled) that is the
issue cost of a step, what set the companion kernels' speed (forty-eighth session: 120 -> 38
instructions a summary step at m = 8 once the ring slots were constants).

Caveat: the recorded constexprs are those the host code picks under the interpreter. Where the host
code picks differently on a GPU (delta_product's ``RAW``: 16-bit inputs go to ``tl.dot`` unconverted,
except under the interpreter) ``compile`` adds the GPU variant too (``--no-gpu-variants`` to skip).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TESTS = ["tests/test_kernels_block_diagonal.py", "tests/test_kernels_bd_shuffles.py",
                 "tests/test_kernels_lookback.py",
                 "tests/test_kernels_fused_gates.py", "tests/test_kernels_companion.py",
                 "tests/test_delta_triton.py", "tests/test_l2norm.py"]
SMEM_MAX = 232448  # H100 (sm_90): 227 KiB of shared memory per block at most (opt-in maximum)


# ----------------------------------------------------------------------------------------- record
def _encode(v):
    """A constexpr value as JSON: tl.dtype values are tagged so ``compile`` can rebuild them."""
    import triton.language as tl
    if isinstance(v, tl.constexpr):
        v = v.value
    if isinstance(v, tl.dtype):
        return {"__dtype__": str(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [_encode(x) for x in v]
    return {"__repr__": repr(v)}  # compile reports these as FAIL (cannot rebuild)


def _is_constexpr(ann) -> bool:
    # the same test as Triton's KernelParam.is_constexpr; string annotations come from modules
    # with ``from __future__ import annotations`` (lookback.py)
    from triton.runtime.jit import _normalize_ty
    return ann is not inspect.Parameter.empty and "constexpr" in _normalize_ty(ann)


def _launch_entry(ifn, args, kwargs):
    """One launch reduced to its GPU cache key: kernel, per-arg (type, attr), constexprs, options."""
    from triton.backends.compiler import BaseBackend
    from triton._C.libtriton import native_specialize_impl
    from triton.runtime.jit import _normalize_ty
    fn = ifn.fn
    sig = inspect.signature(fn)
    names = list(sig.parameters)
    params = {k: v for k, v in kwargs.items() if k in names}
    options = {k: v for k, v in kwargs.items() if k not in names}
    bound = sig.bind(*args, **params)
    bound.apply_defaults()
    dns = set(ifn.kwargs.get("do_not_specialize") or ())
    dnsoa = set(ifn.kwargs.get("do_not_specialize_on_alignment") or ())
    argl, constexprs = [], {}
    for i, (name, p) in enumerate(sig.parameters.items()):
        v = bound.arguments[name]
        if _is_constexpr(p.annotation):
            constexprs[name] = _encode(v)
            continue
        spec = not (i in dns or name in dns)
        align = not (i in dnsoa or name in dnsoa)
        ann = _normalize_ty(p.annotation) if p.annotation is not inspect.Parameter.empty else ""
        if ann:  # an annotated runtime arg (``x: tl.int64``): Triton 3.6's binder rule
            spec = spec and not (ann == "u1" or ann[:2] in ("fp", "bf"))
        ty, attr = native_specialize_impl(BaseBackend, v, False, spec, align)
        if ty == "constexpr":  # int 1 / None, specialised like a constexpr by the GPU JIT
            constexprs[name] = _encode(attr if v is not None else None)
            ty, attr = "constexpr", None
        elif ann:
            ty = ann
        argl.append([name, ty, attr or ""])
    mod = fn.__module__
    if mod.startswith("kernels."):  # source checkout imported as ``kernels.*``
        mod = "lrnn_scan." + mod
    return {"module": mod, "name": fn.__qualname__, "args": argl, "constexprs": constexprs,
            "options": {k: _encode(v) for k, v in sorted(options.items())}}


def record(out: str, pytest_args: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton (conftest only sets a default)
    os.chdir(ROOT)
    import pytest
    from triton.runtime.interpreter import InterpretedFunction
    seen: dict[str, dict] = {}
    errors: list[str] = []
    orig_run = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        try:
            e = _launch_entry(self, args, kwargs)
            key = json.dumps(e, sort_keys=True)
            if key not in seen:
                e["first_test"] = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
                e["count"] = 0
                seen[key] = e
            seen[key]["count"] += 1
        except Exception as ex:  # never break the test run; report what could not be recorded
            errors.append(f"{getattr(self.fn, '__qualname__', self)}: {ex!r}")
        return orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    t0 = time.time()
    try:
        rc = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args])
    finally:
        InterpretedFunction.run = orig_run
    entries = sorted(seen.values(), key=lambda e: (e["module"], e["name"], json.dumps(e, sort_keys=True)))
    with open(out, "w") as f:
        json.dump({"pytest_args": pytest_args, "pytest_rc": int(rc), "errors": sorted(set(errors)),
                   "launches": entries}, f, indent=1)
    print(f"[aot_check] {len(entries)} distinct launches of {len({(e['module'], e['name']) for e in entries})}"
          f" kernels ({sum(e['count'] for e in entries)} launches) -> {out}; pytest rc={int(rc)};"
          f" {len(set(errors))} unrecordable; {time.time() - t0:.0f}s")
    for e in sorted(set(errors)):
        print("[aot_check] not recorded:", e)
    return 0


# ---------------------------------------------------------------------------------------- compile
def _decode(v):
    import triton.language as tl
    if isinstance(v, dict) and "__dtype__" in v:
        return tl.dtype(v["__dtype__"])
    if isinstance(v, dict):
        raise TypeError(f"cannot rebuild constexpr {v}")
    if isinstance(v, list):
        return tuple(_decode(x) for x in v)
    return v


def _compile_one(job: dict) -> dict:
    """Compile one launch for sm_90a with the Triton on the path, then ``ptxas -v`` its PTX."""
    t0 = time.time()
    res = {"status": "FAIL", "regs": None, "spill_st": None, "spill_ld": None, "smem": None, "error": ""}
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        obj = importlib.import_module(job["module"])
        for part in job["name"].split("."):
            obj = getattr(obj, part)
        types = {n: t for n, t, _ in job["args"]}
        cst = {k: _decode(v) for k, v in job["constexprs"].items()}
        for prm in obj.params:  # a constexpr added with a default since the launch was recorded
            if prm.name not in cst and prm.name not in types and prm.is_constexpr and prm.has_default:
                cst[prm.name] = prm.default
        sig = {p: "constexpr" if p in cst else types[p] for p in obj.arg_names}  # param order
        attrs = {(obj.arg_names.index(n),): [["tt.divisibility", 16]] for n, _, a in job["args"] if "D" in a}
        src = ASTSource(fn=obj, signature=sig, constexprs=cst, attrs=attrs)
        opts = {k: _decode(v) for k, v in job["options"].items()}
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
        res["smem"] = int(getattr(c.metadata, "shared", 0) or 0)
        if job.get("ptx_path"):  # for comparing two versions of a kernel: no debug lines/sections
            code = []
            for ln in c.asm["ptx"].splitlines(True):
                if ln.lstrip().startswith(".section") and ".debug" in ln:
                    break  # DWARF sections (source line numbers) come last
                if not ln.lstrip().startswith((".loc", ".file", "//")):
                    code.append(ln)
            with open(job["ptx_path"], "w") as f:
                f.write("".join(code))
            with open(job["ptx_path"][:-4] + ".ttgir", "w") as f:  # layouts: where a convert goes
                f.write(c.asm["ttgir"])
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "k.ptx")
            with open(p, "w") as f:
                f.write(c.asm["ptx"])
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", p, "-o", os.path.join(d, "k.cubin")],
                               capture_output=True, text=True, timeout=300)
            if not r.returncode:
                dis = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c",
                                      os.path.join(d, "k.cubin")], capture_output=True, text=True,
                                     timeout=120)
                res["loop"] = largest_loop(dis.stdout) if not dis.returncode else None
        log = r.stdout + r.stderr
        m = re.search(r"Used (\d+) registers", log)
        s = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
        # a large stack frame with few registers: arrays demoted to local memory (slow, not a failure)
        res.update(regs=int(m.group(1)) if m else None, stack=int(s.group(1)) if s else None,
                   spill_st=int(s.group(2)) if s else None, spill_ld=int(s.group(3)) if s else None)
        if r.returncode:
            res["error"] = "ptxas: " + log.strip().splitlines()[-1]
        elif res["smem"] > SMEM_MAX:  # compiles, but the launch raises OutOfResources on an H100
            res.update(status="SMEM", error=f"shared memory {res['smem']} > {SMEM_MAX}")
        else:
            res["status"] = "OK"
    except Exception as ex:
        # CompilationError's message starts with the source location and excerpt; its last line
        # is the actual error, so report that (the full text goes to --results)
        lines = [ln for ln in str(ex).splitlines() if ln.strip()]
        res["error"] = f"{type(ex).__name__}: {lines[-1] if lines else ''}"[:300]
        chain, e = [], ex
        while e is not None and len(chain) < 8:
            chain.append(str(e))
            e = e.__cause__
        res["error_full"] = " <- ".join(chain)[-4000:]
    res["secs"] = round(time.time() - t0, 1)
    return res


def compile_sm90a(fn, signature: dict, constexprs: dict, num_warps: int, aligned=()) -> dict:
    """One kernel for sm_90a with the Triton on the path (the probes' ``aot`` commands): returns
    ``shared`` (bytes), ``ptxas`` (its ``-v`` lines on registers / spills) and ``sass`` (``nvdisasm
    -c``); ``aligned``: indices of pointer arguments marked 16-byte divisible."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx, "w") as f:
            f.write(c.asm["ptx"])
        r = subprocess.run([os.path.join(bindir, "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", cubin],
                           capture_output=True, text=True)
        dis = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", cubin], capture_output=True, text=True)
    lines = [ln.split(":")[-1].strip() for ln in (r.stdout + r.stderr).splitlines()
             if "registers" in ln or "spill" in ln]
    return {"shared": int(getattr(c.metadata, "shared", 0) or 0), "ptxas": lines, "sass": dis.stdout}


_SASS_INS = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def largest_loop(sass: str) -> dict | None:
    """Instructions of the largest loop in ``nvdisasm -c`` output: the backward branch (``BRA`` to
    a label at or before it) spanning the most instructions. ``{"n", "bar", "sel"}`` or None."""
    lines = sass.splitlines()
    label_at, ins, pending = {}, [], []
    for ln in lines:
        lab = re.match(r"^(\.L_x_\d+):", ln)
        if lab:
            pending.append(lab.group(1))
            continue
        m = _SASS_INS.match(ln)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                label_at[p] = addr
            pending = []
            ins.append((addr, m.group(2)))
    best = None
    for addr, txt in ins:
        tgt = re.search(r"BRA\s+`\((\.L_x_\d+)\)", txt)
        if tgt and tgt.group(1) in label_at and label_at[tgt.group(1)] <= addr:
            span = (label_at[tgt.group(1)], addr)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return None
    body = [t for a, t in ins if best[0] <= a <= best[1]]
    return {"n": len(body), "bar": sum("BAR.SYNC" in t for t in body),
            "sel": sum(bool(re.search(r"\bF?SEL\b", t)) for t in body)}


def _worker(conn):
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(_compile_one(job))


def _run_pool(jobs: list[dict], nproc: int, timeout: float) -> list[dict]:
    """A minimal pool whose workers can be killed: a compile that hangs past ``timeout`` (or a
    worker that dies) costs that one job, and a fresh worker takes its place."""
    import multiprocessing as mp
    from multiprocessing.connection import wait
    ctx = mp.get_context("spawn")
    results: list = [None] * len(jobs)
    todo = list(range(len(jobs)))[::-1]
    workers = []  # [process, conn, job index or None, start time]

    def start():
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(b,), daemon=True)
        p.start()
        return [p, a, None, 0.0]

    def feed(w):
        if todo:
            w[2] = todo.pop()
            w[3] = time.time()
            w[1].send(jobs[w[2]])
        else:
            w[2] = None

    workers = [start() for _ in range(min(nproc, len(jobs)))]
    for w in workers:
        feed(w)
    done = 0
    while done < len(jobs):
        ready = wait([w[1] for w in workers if w[2] is not None], timeout=1.0)
        for i, w in enumerate(workers):
            if w[2] is None:
                continue
            res = None
            if w[1] in ready:
                try:
                    res = w[1].recv()
                except EOFError:
                    res = {"status": "FAIL", "error": "worker died (out of memory?)"}
            elif time.time() - w[3] > timeout:
                res = {"status": "TIMEOUT", "error": f"no result after {timeout:.0f}s"}
            if res is None:
                continue
            results[w[2]] = res
            done += 1
            print(f"[aot_check] {done}/{len(jobs)} {jobs[w[2]]['name']}: {res['status']}", file=sys.stderr, flush=True)
            if res["status"] in ("TIMEOUT",) or "worker died" in res.get("error", ""):
                w[0].kill()
                w[0].join()
                workers[i] = w = start()
            feed(w)
    for w in workers:
        w[1].send(None)
        w[0].join(5)
    return results


def _gpu_variants(launches: list[dict]) -> list[dict]:
    """Launches as a GPU run would issue them where the host code reads TRITON_INTERPRET:
    delta_product/function.py ``_raw``: RAW=True for float16/bfloat16 inputs on the GPU."""
    extra = []
    for e in launches:
        if e["constexprs"].get("RAW") is False and any(t in ("*bf16", "*fp16") for _, t, _ in e["args"]):
            v = json.loads(json.dumps(e))
            v["constexprs"]["RAW"] = True
            v["variant"] = "RAW=True (GPU)"
            extra.append(v)
    return extra


def _short(v) -> str:
    if isinstance(v, dict):
        return v.get("__dtype__", str(v))
    return {True: "T", False: "F"}.get(v, str(v)) if isinstance(v, bool) else str(v)


def compile_all(launches_path: str, nproc: int, timeout: float, results_path: str, gpu_variants: bool,
                ptx_dir: str = "", drop: tuple = (), only: str = "", key_ignore: tuple = ()) -> int:
    """``ptx_dir``: also write each launch's PTX (without debug lines) to ``<ptx_dir>/<key>.ptx``, the
    key a hash of the launch without the constexprs named in ``drop`` or ``key_ignore``, so that a
    kernel edited to lose a constexpr branch can be compared file by file with the PTX its kept
    branch compiled to before: the old source with ``--key-ignore NAME``, the new one with
    ``--drop-constexpr NAME`` (compiled without that recorded constexpr). ``only``: launches whose
    kernel name contains this string."""
    import hashlib

    import triton
    with open(launches_path) as f:
        launches = json.load(f)["launches"]
    if gpu_variants:
        launches = launches + _gpu_variants(launches)
    if only:
        launches = [e for e in launches if only in e["name"]]
    launches = [dict(e, constexprs={k: v for k, v in e["constexprs"].items() if k not in drop}) for e in launches]
    keyf = lambda e: json.dumps([e["module"], e["name"], e["args"], e["constexprs"], e["options"]], sort_keys=True)
    jobs = list({keyf(e): e for e in launches}.values())
    if ptx_dir:
        os.makedirs(ptx_dir, exist_ok=True)
        ign = set(key_ignore) | set(drop)
        for e in jobs:
            e0 = dict(e, constexprs={k: v for k, v in e["constexprs"].items() if k not in ign})
            digest = hashlib.sha1(keyf(e0).encode()).hexdigest()[:12]
            e["ptx_path"] = os.path.join(ptx_dir, f"{e['name']}_{digest}.ptx")
    print(f"[aot_check] triton {triton.__version__} ({os.path.dirname(triton.__file__)}); {len(jobs)} compiles, "
          f"{nproc} workers, {timeout:.0f}s timeout", flush=True)
    t0 = time.time()
    results = _run_pool(jobs, nproc, timeout)
    rows = []
    for e, r in zip(jobs, results):
        dts = sorted({t for _, t, _ in e["args"] if t.startswith("*") and t not in ("*i32", "*i64")})
        cst = " ".join(f"{k}={_short(v)}" for k, v in e["constexprs"].items() if v is not None)
        wsx = f"{e['options'].get('num_warps', 4)}/{e['options'].get('num_stages', 3)}"
        spill = "" if r.get("spill_st") is None else f"{r['spill_st']}/{r['spill_ld']}"
        num = lambda k: "" if r.get(k) is None else str(r[k])
        lp = r.get("loop")
        loop = f"{lp['n']}/{lp['bar']}/{lp['sel']}" if lp else ""
        rows.append([e["module"].replace("lrnn_scan.kernels.", "") + ":" + e["name"], ",".join(dts), cst, wsx,
                     r["status"], num("regs"), spill, num("stack"), num("smem"), loop, r.get("error", "")])
    hdr = ["kernel", "dtypes", "constexprs", "w/s", "status", "regs", "spill st/ld", "stack", "smem",
           "loop ins/bar/sel", "error"]
    rows.sort(key=lambda r: (r[4] == "OK" and r[6] in ("", "0/0"), r[0], r[2]))  # problems first
    width = [max(len(x[i]) for x in rows + [hdr]) for i in range(len(hdr) - 1)]
    for r in [hdr] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, width)) + "  " + r[-1])
    bad = [r for r in rows if r[4] != "OK"]
    spills = [r for r in rows if r[6] not in ("", "0/0")]
    print(f"[aot_check] {len(rows)} compiles: {len(rows) - len(bad)} OK, {len(bad)} failed/timeout/smem, "
          f"{len(spills)} spilling; {time.time() - t0:.0f}s")
    if results_path:
        with open(results_path, "w") as f:
            json.dump([{**e, "result": r} for e, r in zip(jobs, results)], f, indent=1)
    return 1 if bad else 0


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("record", help="run pytest under the interpreter, record kernel launches")
    r.add_argument("--out", default="/tmp/aot_launches.json")
    c = sub.add_parser("compile", help="compile recorded launches for sm_90a (Triton 3.6 on PYTHONPATH)")
    c.add_argument("--launches", default="/tmp/aot_launches.json")
    c.add_argument("--jobs", type=int, default=2)
    c.add_argument("--timeout", type=float, default=180.0, help="seconds per compile")
    c.add_argument("--results", default="/tmp/aot_results.json", help="full results incl. error text")
    c.add_argument("--no-gpu-variants", action="store_true")
    c.add_argument("--ptx-dir", default="", help="write each launch's PTX (and TTGIR) here (compare two versions)")
    c.add_argument("--drop-constexpr", nargs="*", default=[], metavar="NAME",
                   help="leave these recorded constexprs out (a branch removed from the kernel)")
    c.add_argument("--key-ignore", nargs="*", default=[], metavar="NAME",
                   help="compile with these constexprs but leave them out of the --ptx-dir file names")
    c.add_argument("--only", default="", help="only kernels whose name contains this")
    a = ap.parse_args(argv)
    if a.mode == "record":
        return record(a.out, extra or DEFAULT_TESTS)
    os.environ.pop("TRITON_INTERPRET", None)  # real JITFunctions: kernels are imported, not run
    os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/aot_check_triton_cache")
    if ROOT not in sys.path:
        sys.path.append(ROOT)  # after PYTHONPATH, so /tmp/t36's triton wins
    return compile_all(a.launches, a.jobs, a.timeout, a.results, not a.no_gpu_variants,
                       a.ptx_dir, tuple(a.drop_constexpr), a.only, tuple(a.key_ignore))


if __name__ == "__main__":
    sys.exit(main())
