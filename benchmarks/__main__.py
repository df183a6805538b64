"""``python -m benchmarks [args]`` from the repository root: a thin wrapper around
``lrnn-scan bench`` (:func:`lrnn_scan.bench.cli.main`) writing to ``benchmarks/out`` by default.
``--record`` appends to ``benchmarks/RESULTS.md``."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _main(argv=None):
    try:
        from lrnn_scan.bench.cli import main
    except ImportError:  # an uninstalled checkout: the package folder is at the root
        sys.path.insert(0, str(ROOT))
        from lrnn_scan.bench.cli import main
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv += ["--out", str(ROOT / "benchmarks" / "out")]
    if "--record" in argv and not any(a == "--results" or a.startswith("--results=") for a in argv):
        argv += ["--results", str(ROOT / "benchmarks" / "RESULTS.md")]
    return main(argv)


if __name__ == "__main__":
    sys.exit(_main())
