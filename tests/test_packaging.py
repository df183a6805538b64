"""The wheel ships lrnn_scan* only (PyPI's `kernels` and `models` are other projects)."""
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lrnn_scan

ROOT = Path(__file__).resolve().parents[1]


def test_version_and_all():
    assert isinstance(lrnn_scan.__version__, str) and lrnn_scan.__version__.count(".") == 2
    for name in lrnn_scan.__all__:
        assert hasattr(lrnn_scan, name), name


def test_import_has_no_side_effects():
    code = ("import sys, lrnn_scan; bad = [m for m in ('triton', 'lrnn_scan.kernels') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs the 'build' package "
                    "(pip install 'lrnn-scan[test]')")
def test_wheel_contains_only_lrnn_scan(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache",
        "out", ".whl"))
    res = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                          "--outdir", str(tmp_path / "dist"), str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    tops = {t for t in tops if not t.endswith(".dist-info")}
    assert tops == {"lrnn_scan"}, tops
    for sub in ("lrnn_scan/kernels/__init__.py", "lrnn_scan/models/__init__.py",
                "lrnn_scan/mad_tasks/__init__.py", "lrnn_scan/operators/__init__.py"):
        assert sub in names, sub


def test_ci_runs_the_readme_test_command():
    """`.ci/run` runs the README's test command (the brief: one command for users and CI)."""
    readme = (ROOT / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if "pip install -e \".[test]\"" in ln]
    command = line[line.index("python -m pytest"):].replace("python -m", "python3 -m")
    ci = (ROOT / ".ci" / "run").read_text()
    assert any(ln.strip().startswith(command) for ln in ci.splitlines()), (command, ci)
