"""Device-side tools on the CPU: tools/gpu_suite_resume.sh (the GPU checks over several device
calls; here on a tiny generated test file) and tools/ncu_m1.py (what Nsight Compute runs)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import pytest

@pytest.mark.parametrize("i", [0, 1, 2])
def test_ok(i):
    assert i >= 0

def test_bad():
    assert False
'''


def _call(tmp_path, out, passed_in, timeout=480):
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "SUITE_PASSED": str(passed_in), "SUITE_TIMEOUT": str(timeout),
           "SUITE_FILES": str(tmp_path / "test_tiny.py"), "TRITON_CACHE_DIR": str(tmp_path / "no_cache"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return subprocess.run(["bash", str(ROOT / "tools" / "gpu_suite_resume.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120).stdout


def test_second_call_skips_what_the_first_passed(tmp_path):
    """Call 1 records the three passes (not the failure) and reports the failure; call 2 reads
    that list, deselects the three and runs only the failing test again."""
    (tmp_path / "test_tiny.py").write_text(TESTS)
    first = _call(tmp_path, tmp_path / "out1", tmp_path / "absent.txt")
    assert "this call 3 passed, 1 failed or errored; 3 passed in all; finished with failures" in first
    assert "FAILED " in first and "test_bad" in first
    ids = (tmp_path / "out1" / "suite_passed.txt").read_text().split()
    assert sorted(x.split("::")[1] for x in ids) == ["test_ok[0]", "test_ok[1]", "test_ok[2]"]
    second = _call(tmp_path, tmp_path / "out2", tmp_path / "out1" / "suite_passed.txt")
    assert "3 tests passed in earlier calls, deselected" in second
    assert "this call 0 passed, 1 failed or errored; 3 passed in all" in second
    assert "3 deselected" in (tmp_path / "out2" / "suite.log").read_text()


def test_a_call_stopped_by_its_time_limit_keeps_its_passes(tmp_path):
    """The passes before the test that the time limit cut are on the list (written as they
    happen, not at the end of the run)."""
    (tmp_path / "test_tiny.py").write_text(TESTS.replace("assert False", "import time; time.sleep(60)"))
    first = _call(tmp_path, tmp_path / "out1", tmp_path / "absent.txt", timeout=8)
    assert "this call 3 passed" in first and "stopped at SUITE_TIMEOUT" in first, first
    assert len((tmp_path / "out1" / "suite_passed.txt").read_text().split()) == 3


def test_ncu_m1_driver_runs_on_the_interpreter(capsys):
    """tools/ncu_m1.py: each TUNE setting runs the m = 1 forward (the TMA kernel forced, then
    the tile kernel) on the CPU interpreter; no accelerated-scan there."""
    pytest.importorskip("triton")
    import importlib.util
    spec = importlib.util.spec_from_file_location("ncu_m1", ROOT / "tools" / "ncu_m1.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--device", "cpu", "--shape", "2x37x64", "--runs", "1",
              "--configs", 'tma={"diag_tma": true}', 'tile={"diag_tma": false}'])
    assert capsys.readouterr().out.split() == ["tma", "done", "tile", "done"]
