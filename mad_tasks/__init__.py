"""Synthetic benchmarks for structured linear recurrences (issue 6), shipped as
``lrnn_scan.mad_tasks``.

* Generators (deterministic from one ``numpy.random.Generator``): :mod:`.mad` (in-context recall,
  noisy/fuzzy recall, selective copying, compression, memorization), :mod:`.groups` (S_n, A_n,
  Z_n and direct-product word problems), :mod:`.chomsky` (parity, cycle navigation, modular
  arithmetic with/without brackets); :func:`make_task` builds a task's train/test data by name.
* Harness: :mod:`.wrappers` (decoder-only LM, autoencoder), :mod:`.layers` (model registry over
  :mod:`lrnn_scan.models`, with reference layers as a fallback), :mod:`.train` (:func:`train`,
  :func:`run_grid`), :mod:`.sweep`, :mod:`.spectrum`, and the ``lrnn-scan`` CLI (:mod:`.cli`);
  :mod:`.distributed`: ``train`` under ``torchrun`` (DDP, or ``--sequence-parallel`` time shards).

Specification: ``shared/reference/tasks.md``; results: ``mad_tasks/RESULTS.md``.
"""
from .groups import (Group, alternating_group, cyclic_group, direct_product, group_from_name,
                     prefix_products, symmetric_group, word_problem_dataset)
from .tasks import TASK_NAMES, TaskData, make_task
from .train import TrainConfig, evaluate, run_grid, train

__all__ = ["Group", "symmetric_group", "alternating_group", "cyclic_group", "direct_product",
           "group_from_name", "prefix_products", "word_problem_dataset", "make_task", "TaskData",
           "TASK_NAMES", "TrainConfig", "train", "run_grid", "evaluate"]
