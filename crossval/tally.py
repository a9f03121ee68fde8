"""Counts the crossval tests record while they run, for the summary table printed at the end of
``pytest crossval`` (:func:`crossval.conftest.pytest_terminal_summary`).

A test calls :func:`example` once per Hypothesis example (or hand-made case) it checked, and
:func:`certificate` once per certificate it checked (naming the theorems whose criterion it checks). Counts are keyed by the test's
``<file>::<function>`` (parameters dropped), the form the registry uses.
"""

from __future__ import annotations

import os
from collections import Counter

examples: Counter[str] = Counter()
certificates: Counter[str] = Counter()
certificates_total = 0


def current_test() -> str:
    """``<file>::<function>`` of the running test, e.g. ``test_ridge_props.py::test_gap_identity``."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "?::?").split(" ")[0]
    path, _, name = node.partition("::")
    return f"{os.path.basename(path)}::{name.split('[')[0]}"


def example(n: int = 1) -> None:
    """Record ``n`` examples checked by the running test."""
    examples[current_test()] += n


def certificate(*theorems: str, n: int = 1) -> None:
    """Record ``n`` certificates checked against the criterion of each of ``theorems`` (registry names)."""
    global certificates_total
    for t in theorems:
        certificates[t] += n
    certificates_total += n
