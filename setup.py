"""Only computes the package list; all metadata lives in pyproject.toml.

``kernels/``, ``models/`` and ``mad_tasks/`` are shipped as ``lrnn_scan.kernels`` etc. (see
``[tool.setuptools.package-dir]``); their sub-packages must be listed under those names, which
``find_packages`` cannot do by itself.
"""
from setuptools import find_packages, setup

ROOTS = {"lrnn_scan": "lrnn_scan", "lrnn_scan.kernels": "kernels",
         "lrnn_scan.models": "models", "lrnn_scan.mad_tasks": "mad_tasks"}


def _packages():
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(set(found))


setup(packages=_packages())
