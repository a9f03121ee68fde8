"""The statement registry (:mod:`crossval.registry`) against the Lean sources, the Python package and
the crossval tests."""

from __future__ import annotations

import importlib
import re

import pytest

from crossval.registry import LEAN_DIR, REGISTRY, ROOT, forbidden, lean_files, theorems


def all_theorems() -> dict[str, tuple[str, bool]]:
    """``{name: (file, public)}`` over every KvaLean source file."""
    out = {}
    for path in lean_files():
        for name, public in theorems(path).items():
            out[name] = (str(path.relative_to(ROOT)), public)
    return out


def test_lean_sources_present():
    files = [p.name for p in lean_files()]
    assert LEAN_DIR.is_dir() and len(files) >= 6, files
    for name in ("LinAlg.lean", "Ridge.lean", "Identity.lean", "Causality.lean", "Certificate.lean",
                 "CertExamples.lean"):
        assert name in files


@pytest.mark.parametrize("path", lean_files(), ids=lambda p: p.name)
def test_no_sorry_admit_native_decide_or_axiom(path):
    assert forbidden(path) == [], f"{path.name} holds {forbidden(path)}"


def test_every_registered_theorem_is_in_its_file():
    found = all_theorems()
    names = [e.theorem for e in REGISTRY]
    assert len(names) == len(set(names)), "a theorem is registered twice"
    missing = [f"{e.theorem} ({e.file})" for e in REGISTRY if found.get(e.theorem, (None, False)) != (e.file, True)]
    assert not missing, f"registered but not a public theorem of that file: {missing}"


def test_every_public_theorem_is_registered():
    registered = {e.theorem for e in REGISTRY}
    unregistered = sorted(f"{n} ({f})" for n, (f, public) in all_theorems().items() if public and n not in registered)
    assert not unregistered, f"public KvaLean theorems without a registry entry: {unregistered}"


def resolve(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def is_function(dotted: str) -> bool:
    try:
        return callable(resolve(dotted)) and not isinstance(resolve(dotted), type(importlib))
    except (ImportError, AttributeError, ValueError):
        return False


def test_registry_python_names_exist():
    for e in REGISTRY:
        for name in e.python:
            assert callable(resolve(name)), f"{e.theorem}: {name} is not a function"


def test_registry_tests_exist_and_every_property_test_is_registered():
    named = {t for e in REGISTRY for t in e.tests}
    for e in REGISTRY:
        assert e.tests, f"{e.theorem} has no crossval test"
    for test in named:
        file, _, func = test.partition("::")
        module = importlib.import_module(f"crossval.{file.removesuffix('.py')}")
        assert callable(getattr(module, func, None)), f"{test} does not exist"
    for file in ("test_ridge_props.py", "test_fill_props.py", "test_certificates.py",
                 "test_identity_limit.py", "test_stream_props.py", "test_stability_props.py"):
        module = importlib.import_module(f"crossval.{file.removesuffix('.py')}")
        tests = {f"{file}::{n}" for n in dir(module) if n.startswith("test_")}
        assert tests <= named, f"crossval tests checking no registered theorem: {sorted(tests - named)}"


def test_main_theorems_name_the_python_they_constrain():
    """Each theorem whose Lean docstring names a ``ridgefill.`` function lists that function here."""
    for e in REGISTRY:
        text = (ROOT / e.file).read_text(encoding="utf-8")
        short = e.theorem.rsplit(".", 1)[-1]
        m = re.search(r"/--((?:(?!-/).)*)-/\s*(?:@\[[^\]]*\]\s*)*(?:protected\s+)?theorem\s+" + re.escape(short) + r"\b",
                      text, re.DOTALL)
        named = {n for n in re.findall(r"ridgefill\.[\w.]+\w", m.group(1)) if is_function(n)} if m else set()
        missing = {n for n in named if n not in e.python}
        assert not missing, f"{e.theorem}: its docstring names {sorted(missing)}, the registry does not"


def test_docs_table_lists_each_theorems_crossval_tests():
    """docs/kvalean.md's theorem table: every named theorem is registered, and its row's crossval column
    lists exactly the tests registered for the theorems of that row."""
    registry = {e.theorem: e for e in REGISTRY}
    text = (ROOT / "docs" / "kvalean.md").read_text(encoding="utf-8")
    head = "| theorem | meaning for RidgeFill | Python | file | crossval test |"
    assert head in text, "the theorem table has no crossval test column"
    rows = [line for line in text.split(head, 1)[1].split("\n\n", 1)[0].splitlines() if line.startswith("| `")]
    assert len(rows) >= 40, len(rows)
    for row in rows:
        cells = row.split(" | ")
        assert len(cells) == 5, row
        prefix, expected = "", []
        for name in re.findall(r"`([^`]+)`", cells[0]):
            if "." in name:
                prefix = name.rsplit(".", 1)[0] + "."
            elif f"KvaLean.{name}" not in registry:
                name = prefix + name
            assert f"KvaLean.{name}" in registry, f"docs table names {name}, not a registered theorem"
            expected += [t for t in registry[f"KvaLean.{name}"].tests if t not in expected]
        listed = re.findall(r"`([^`]+)`", cells[4])
        assert listed == [t.replace(".py::", "::") for t in expected], row[:60]
