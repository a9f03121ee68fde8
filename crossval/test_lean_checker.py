"""``.ci/check-lean`` on planted escapes.

The scan cases copy the Lean sources to a temporary folder, plant one way around the kernel or the
audit in one file and assert that the token scan reports it on that line (plain Python, no Lean).
The report cases feed ``.ci/kvalean_check.py report`` a made-up Lean log (pins, the run's tag). One
case runs Lean: it plants every escape of ``crossval/lean_plants/Plant.lean`` at once in a copy of
the sources and runs ``.ci/check-lean --no-scan``, so that the kernel replay, the audit and the pins
must catch each one without the scan (one Lean run, about as long as ``.ci/check-lean`` itself).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

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
    "by_elab": "theorem t1 : True := by_elab return Lean.mkConst ``True.intro",
    "by_elab without Lean": "open Lean in\ntheorem t1 : True := by_elab return mkConst ``True.intro",
    "run_tac": "theorem t1 : True := by run_tac pure ()",
    "Lean name": "theorem t1 : True := by have := Lean.Elab.Command.elabCommand; trivial",
    "open Lean": "open Lean Elab",
    "root Lean name": "theorem t1 : True := by have := _root_.Lean.addDecl; trivial",
    "quoted name": "theorem t1 : True := by have := «Lean».addDecl; trivial",
    "interpolated string": 'theorem t1 : s!"{(sorry : Nat)}" = "0" := rfl',
    "partial": "partial def f0 (n : Nat) : Nat := f0 n",
    "opaque": "opaque f0 : Nat",
    "set_option debug": "set_option debug.skipKernelTC true in\ntheorem t1 : True := trivial",
    "set_option other": "set_option pp.all true",
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


@pytest.mark.parametrize("raw", ['r"\\"', 'r#"\\"#', 'r##"a"#"##'])
def test_raw_string_hides_no_line(tmp_path, raw):
    """A raw string has no escapes: ``r"\\"`` ends at its second quote. Read as an ordinary string,
    the quote would look escaped and hide the lines after it; the scan reads it as Lean does, reports
    the raw string itself and the axiom on the next line."""
    root = copy_sources(tmp_path)
    path = root / "KvaLean" / "Ridge.lean"
    text = path.read_text(encoding="utf-8")
    planted = f"theorem t1 : {raw}.length = 1 := rfl\naxiom cheat : False\n"
    text = text.replace(MARK, planted + MARK)
    path.write_text(text, encoding="utf-8")
    line = text[: text.index(planted)].count("\n") + 1
    found = kvalean_check.scan(root)
    assert any(f.startswith(f"KvaLean/Ridge.lean:{line}: a raw string") for f in found), found
    assert any(f.startswith(f"KvaLean/Ridge.lean:{line + 1}: an axiom") for f in found), found


# ---------------------------------------------------------------- the report, on a made-up log

def fake_run(tmp_path, body: str, tag="KVAtesttag"):
    """A Check.json and a log with one module ``M`` declaring the definition ``M.f`` with ``body``."""
    out = tmp_path / "Check.lean"
    out.write_text("", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(
        {"tag": tag, "modules": {"M": {"file": "M.lean", "start": 1, "end": 2, "closure": []}}}),
        encoding="utf-8")
    log = "\n".join([
        f"{tag} IN M M.f",
        f"{tag} DECL M.f def safe elab",
        f"{tag} AXIOMS M.f : ",
        f"{tag} USES M.f : Nat@Init.Prelude",
        f"{tag} STMT M.f", "Nat -> Nat", f"{tag} STMT-END",
        f"{tag} VALUE M.f", body, f"{tag} VALUE-END",
        f"{tag} AUDIT-DONE",
        f"{tag} REPLAY-OK M.f",
        f"{tag} REPLAY-DONE 1 0",
    ]) + "\n"
    (tmp_path / "check.log").write_text(log, encoding="utf-8")
    return out


def test_changed_definition_body_fails_the_pins(tmp_path, capsys):
    out = fake_run(tmp_path, "fun (n : Nat) => HAdd.hAdd.{0, 0, 0} Nat Nat Nat (instHAdd.{0} Nat instAddNat) n n")
    pins = tmp_path / "pins.txt"
    assert kvalean_check.report(out, tmp_path / "check.log", pins, update=True) == 0
    assert "M.f := " in pins.read_text(encoding="utf-8")
    assert kvalean_check.report(out, tmp_path / "check.log", pins, update=False) == 0
    capsys.readouterr()
    out = fake_run(tmp_path, "fun (n : Nat) => HMul.hMul.{0, 0, 0} Nat Nat Nat (instHMul.{0} Nat instMulNat) n n")
    assert kvalean_check.report(out, tmp_path / "check.log", pins, update=False) == 1
    assert "AUDIT-FAIL the value of M.f changed" in capsys.readouterr().out


def test_lines_without_the_runs_tag_count_for_nothing(tmp_path, capsys):
    out = fake_run(tmp_path, "fun (n : Nat) => n")
    log = tmp_path / "check.log"
    text = log.read_text(encoding="utf-8").replace("KVAtesttag", "KVAother")
    log.write_text(text + "AUDIT-DONE\nREPLAY-DONE 1 0\n", encoding="utf-8")
    pins = tmp_path / "pins.txt"
    pins.write_text("", encoding="utf-8")
    assert kvalean_check.report(out, log, pins, update=False) == 1
    shown = capsys.readouterr().out
    assert "the audit did not finish" in shown and "the kernel replay did not finish" in shown


# ---------------------------------------------------------------- one Lean run, every plant at once

PLANTS = ROOT / "crossval" / "lean_plants" / "Plant.lean"
# plant -> what the audit must say about it (a regular expression on the AUDIT-FAIL lines)
CAUGHT = {
    "theorem the kernel never saw": r"KvaPlant\.cheat: the kernel rejects it on replay",
    "private theorem the kernel never saw": r"_private\.\S*KvaPlant\.hidden: the kernel rejects it on replay",
    "private theorem pinned": r"statement of _private\.\S*KvaPlant\.privateThm is not pinned",
    "theorem named like a generated one pinned": r"statement of KvaPlant\.aux\.proof_7 is not pinned",
    "axiom": r"KvaPlant\.ax: an axiom declared in the sources",
    "sorry": r"KvaPlant\.withSorry: depends on the axiom sorryAx",
    "unsafe": r"KvaPlant\.unsafeDef: unsafe declaration",
    "partial": r"KvaPlant\.partialDef\S*: (partial|unsafe) declaration",
    "changed definition body": r"the value of KvaLean\.normSq changed",
    "weakened statement": r"the statement of KvaLean\.sum_zero_dim changed",
}


def test_planted_escapes_fail_the_lean_check(tmp_path):
    root = copy_sources(tmp_path)
    shutil.copy(PLANTS, root / "KvaLean" / "Plant.lean")
    pins = root / "KvaLean" / "expected-statements.txt"
    text = pins.read_text(encoding="utf-8")
    # the pins of the committed sources, with one value and one statement changed: the check must
    # find the sources' declarations differ from them
    text, k1 = re.subn(r"^(KvaLean\.normSq :=) \S+$", r"\1 0123456789abcdef0123456789abcdef", text, flags=re.M)
    text, k2 = re.subn(r"^(KvaLean\.sum_zero_dim :) (.*)$", r"\1 True", text, flags=re.M)
    assert k1 == 1 and k2 == 1, "the pins to change are missing"
    pins.write_text(text, encoding="utf-8")
    run = subprocess.run(["bash", str(ROOT / ".ci" / "check-lean"), "--root", str(root), "--no-scan"],
                         capture_output=True, text=True, timeout=1500)
    shown = run.stdout + run.stderr
    assert run.returncode == 1, shown[-4000:]
    fails = [line for line in shown.splitlines() if "AUDIT-FAIL" in line]
    missed = [name for name, pat in CAUGHT.items() if not any(re.search(pat, f) for f in fails)]
    assert not missed, (missed, shown[-6000:])
    assert re.search(r"check-lean: FAIL: failed:.*\baudit\b", shown), shown[-3000:]
    # the fake audit lines printed by the plants did not count: the replay of KvaPlant.cheat failed
    # although a line claims it passed, and the real declarations all replayed
    assert re.search(r"kernel replay into a fresh environment \(Init only\): \d+ accepted, [1-9]\d* rejected", shown)
    # nothing of the committed sources failed besides the two changed pins
    others = [f for f in fails if "KvaPlant" not in f and "normSq" not in f and "sum_zero_dim" not in f]
    assert not others, others


def test_only_declarations_made_from_a_parent_are_exempt():
    """``P.proof_k`` is exempt only when ``P``'s value refers to it; ``P.injEq`` only when it refers to
    ``P``; a lone ``aux.proof_7`` or a private theorem is pinned."""
    decls = {
        "_private.Check.0.KvaLean.foo": {"uses": ["_private.Check.0.KvaLean.foo.proof_1@local"]},
        "_private.Check.0.KvaLean.foo.proof_1": {},
        "KvaLean.bar": {"uses": ["Nat@Init.Prelude"]},
        "KvaLean.bar.proof_2": {},
        "aux.proof_7": {},
        "KvaLean.S.mk.injEq": {"uses": ["KvaLean.S.mk@local"]},
        "KvaLean.S.mk.inj": {"uses": ["Nat@Init.Prelude"]},
    }
    made = {n: kvalean_check.made_from_parent(n, decls) for n in decls}
    assert made == {"_private.Check.0.KvaLean.foo": False, "_private.Check.0.KvaLean.foo.proof_1": True,
                    "KvaLean.bar": False, "KvaLean.bar.proof_2": False, "aux.proof_7": False,
                    "KvaLean.S.mk.injEq": True, "KvaLean.S.mk.inj": False}
