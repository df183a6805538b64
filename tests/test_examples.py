"""The README's examples run as written."""
import re
import runpy
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_custom_operator_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "custom_operator.py"), run_name="__main__")
    assert "laws hold" in capsys.readouterr().out


def test_quickstart_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    assert "HouseholderProduct states" in capsys.readouterr().out


def test_readme_python_blocks_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    env = {}
    exec(blocks[0], env)                                     # the main example
    assert env["h"].shape == (2, 1000, 16) and env["hT"].shape == (2, 16, 3)
    ns = {"torch": torch, "ls": __import__("lrnn_scan")}
    ns["check_operator_laws"] = __import__("lrnn_scan.testing", fromlist=["x"]).check_operator_laws
    exec(blocks[1], ns)                                      # the custom operator, laws checked
