"""The source scan of ``.ci/check-lean`` (``.ci/kvalean_check.py scan``) on planted escapes.

Each case copies the Lean sources to a temporary folder, plants one way around the kernel or the
audit in one file and asserts that the scan reports it on that line. No Lean runs here (the scan is
plain Python); the audit's own checks (axioms from the environment, module boundaries, pinned
statements) run in ``.ci/check-lean`` itself.
"""

from __future__ import annotations

import shutil

import pytest

from crossval.registry import ROOT, checker

kvalean_check = checker()

MARK = "end KvaLean\n"  # Ridge.lean closes its namespace with this line; plants go just before it

ESCAPES = {
    "docstring before axiom": "/-- looks like a comment -/ axiom cheat : False",
    "attribute before axiom": "@[simp] axiom cheat : False",
    "axiom after other text": "theorem t0 : True := trivial  axiom cheat : False",
    "root axiom": "axiom _root_.cheat : False",
    "private axiom": "private axiom cheat : False",
    "sorry": "theorem t1 : 1 = 2 := by sorry",
    "admit": "theorem t1 : 1 = 2 := by admit",
    "native_decide": "theorem t1 : 2 + 2 = 4 := by native_decide",
    "decide +native": "theorem t1 : 2 + 2 = 4 := by decide +native",
    "ofReduceBool": "theorem t1 : True := by have := Lean.ofReduceBool; trivial",
    "implemented_by": "@[implemented_by id] def f0 (n : Nat) : Nat := n",
    "extern": '@[extern "c_f"] opaque f0 : Nat → Nat',
    "unsafe": "unsafe def f0 : Nat := 0",
    "skipKernelTC": "set_option debug.skipKernelTC true in\ntheorem t1 : True := trivial",
    "elab": 'elab "cheat" : tactic => pure ()',
    "meta": "meta def f0 : Nat := 0",
    "macro": 'macro "cheat" : tactic => `(tactic| trivial)',
    "syntax": 'syntax "cheat" : tactic',
    "notation": 'notation "𝟙" => (1 : Nat)',
    "run_cmd": "run_cmd pure ()",
    "#eval": "#eval 1",
    "#exit": "#exit",
    "example": "example : 1 = 1 := rfl",
    "private example": "private theorem t2 : True := trivial\nexample : True := t2",
    "import Lean": None,  # planted at the top, see below
    "def without expose": "def f0 : Nat := 0",
}


def copy_sources(tmp_path):
    shutil.copytree(ROOT / "KvaLean", tmp_path / "KvaLean")
    shutil.copy(ROOT / "KvaLean.lean", tmp_path / "KvaLean.lean")
    return tmp_path


def test_committed_sources_pass_the_scan():
    assert kvalean_check.scan(ROOT) == []


def test_words_in_comments_and_strings_are_not_tokens(tmp_path):
    root = copy_sources(tmp_path)
    path = root / "KvaLean" / "Ridge.lean"
    text = path.read_text(encoding="utf-8")
    planted = ('/-- no axiom, sorry or native_decide here /- nested: unsafe -/ -/\n'
               '-- elab macro syntax #eval example\n'
               'theorem t3 : "axiom sorry".length = 11 := rfl\n')
    path.write_text(text.replace(MARK, planted + MARK), encoding="utf-8")
    assert kvalean_check.scan(root) == []


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_planted_escape_fails_the_scan(tmp_path, name):
    root = copy_sources(tmp_path)
    path = root / "KvaLean" / "Ridge.lean"
    text = path.read_text(encoding="utf-8")
    if ESCAPES[name] is None:
        text = text.replace("public import KvaLean.LinAlg\n", "public import KvaLean.LinAlg\npublic import Lean\n")
        line = text.splitlines().index("public import Lean") + 1
    else:
        text = text.replace(MARK, ESCAPES[name] + "\n" + MARK)
        line = text[: text.index(ESCAPES[name])].count("\n") + 1 + ESCAPES[name].count("\n") * (
            name == "private example")
    assert text != path.read_text(encoding="utf-8"), "the plant did not apply"
    path.write_text(text, encoding="utf-8")
    found = kvalean_check.scan(root)
    hits = [f for f in found if f.startswith(f"KvaLean/Ridge.lean:{line}:")]
    assert hits, (name, line, found)
