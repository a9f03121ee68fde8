"""The source scan, the one-file build and the report of ``.ci/check-lean`` (see that script).

    python3 .ci/kvalean_check.py scan ROOT            token scan and module rules; exit 1 on a finding
    python3 .ci/kvalean_check.py gen ROOT OUT.lean    one file: every module in dependency order + audit
    python3 .ci/kvalean_check.py report OUT.lean LOG EXPECTED [--update]
                                                     judge the Lean output of that file

Standard library only (any Python 3.9+).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

ALLOWED_AXIOMS = ("propext", "Classical.choice", "Quot.sound")

# Words that must not appear as tokens in the sources (comments and strings removed): each is a way
# around the kernel or code that runs at elaboration time.
FORBIDDEN = {
    "axiom": "an axiom declaration",
    "sorry": "sorry",
    "admit": "admit",
    "native_decide": "native_decide (trusts the compiler through Lean.ofReduceBool)",
    "native": "native evaluation (decide +native)",
    "implemented_by": "implemented_by",
    "extern": "extern",
    "unsafe": "unsafe code",
    "skipKernelTC": "debug.skipKernelTC (skips the kernel)",
    "ofReduceBool": "Lean.ofReduceBool",
    "ofReduceNat": "Lean.ofReduceNat",
    "trustCompiler": "Lean.trustCompiler",
    "elab": "elaborator code",
    "elab_rules": "elaborator code",
    "meta": "meta code",
    "macro": "macro code",
    "macro_rules": "macro code",
    "syntax": "a syntax extension",
    "declare_syntax_cat": "a syntax extension",
    "notation": "a notation (a macro)",
    "infix": "a notation (a macro)",
    "infixl": "a notation (a macro)",
    "infixr": "a notation (a macro)",
    "prefix": "a notation (a macro)",
    "postfix": "a notation (a macro)",
    "initialize": "initialize",
    "builtin_initialize": "initialize",
    "run_cmd": "run_cmd",
    "run_elab": "run_elab",
    "run_meta": "run_meta",
    "#eval": "#eval",
    "#exit": "#exit (stops checking the file)",
    "example": "an example (anonymous: nothing can audit it; state it as a named theorem)",
}
_ID = r"[A-Za-z_\u00C0-\uFFFF][\w'!?\u00C0-\uFFFF]*"
_TOKEN = re.compile(r"#?" + _ID + r"(?:\." + _ID + r")*")
_IMPORT = re.compile(r"^\s*((?:public\s+)?(?:meta\s+)?import)\s+(\S+)")


def strip(src: str) -> str:
    """``src`` with comments (nested ``/- -/``, ``--``), string and char literals blanked; newlines kept."""
    out, i, n = [], 0, len(src)
    blank = lambda s: re.sub(r"[^\n]", " ", s)  # noqa: E731
    while i < n:
        c = src[i]
        if src.startswith("/-", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/-", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("-/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("--", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(blank(src[i:j + 1]))
            i = j + 1
        elif c == "'" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] in "_'!?")):
            m = re.match(r"'(\\[^']*|[^\\'])'", src[i:i + 12])
            out.append(blank(m.group(0)) if m else c)
            i += len(m.group(0)) if m else 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def sources(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "KvaLean").rglob("*.lean")) + [root / "KvaLean.lean"]


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def imports(text: str) -> list[str]:
    return [m.group(2) for line in strip(text).splitlines() if (m := _IMPORT.match(line))]


def scan(root: pathlib.Path) -> list[str]:
    """Every forbidden token, and every break of the module rules that make the one-file check
    equivalent to building module by module (``lake build``)."""
    bad = []
    files = sources(root)
    mods = {module_name(root, p) for p in files}
    for p in files:
        rel = p.relative_to(root)
        raw = p.read_text(encoding="utf-8")
        lines, shown = strip(raw).splitlines(), raw.splitlines()
        for ln, line in enumerate(lines, 1):
            hit = None
            for m in _TOKEN.finditer(line):
                for part in m.group(0).split("."):
                    if part in FORBIDDEN or ("#" + part) in FORBIDDEN and m.group(0).startswith("#"):
                        hit = FORBIDDEN.get(part) or FORBIDDEN["#" + part]
                        break
                if m.group(0) in FORBIDDEN:
                    hit = FORBIDDEN[m.group(0)]
                if hit:
                    break
            if not hit and re.search(r"\+\s*native", line):
                hit = FORBIDDEN["native"]
            if hit:
                bad.append(f"{rel}:{ln}: {hit}: {shown[ln - 1].strip()[:110]}")
            m = _IMPORT.match(line)
            if m:
                if m.group(1) != "public import":
                    bad.append(f"{rel}:{ln}: write `public import` (modules re-export what they import)")
                if m.group(2) not in mods:
                    bad.append(f"{rel}:{ln}: import {m.group(2)}: only KvaLean modules may be imported "
                               "(Init comes with every file)")
        code = [(ln, s.strip()) for ln, s in enumerate(lines, 1) if s.strip()]
        if not code or code[0][1] != "module":
            bad.append(f"{rel}:1: the file must start with `module` (the module system of lake build)")
        body = [(ln, s) for ln, s in code[1:] if not _IMPORT.match(s)]
        if p.name != "KvaLean.lean" and (not body or body[0][1] != "public section"):
            bad.append(f"{rel}: `public section` must follow the imports (else importers see nothing)")
        # a definition whose body another module may unfold must be exported: every non-private
        # `def`/`abbrev`/`instance` carries `@[expose]` (on its line or the attribute line above it)
        for k, (ln, s) in enumerate(code):
            m = re.match(r"^(@\[[^\]]*\]\s*)*((private|protected|noncomputable|partial|nonrec|scoped|local)\s+)*"
                         r"(def|abbrev|instance)\b", s)
            if not m or re.search(r"\bprivate\b", s):
                continue
            attrs = s[:m.start(4)]
            if k > 0 and code[k - 1][1].startswith("@[") and code[k - 1][1].endswith("]"):
                attrs += code[k - 1][1]
            if not re.search(r"\bexpose\b", attrs):
                bad.append(f"{rel}:{ln}: mark `{m.group(4)}` with `@[expose]` (importers may unfold it)")
    return bad


def module_graph(root: pathlib.Path) -> dict[str, list[str]]:
    return {module_name(root, p): imports(p.read_text(encoding="utf-8")) for p in sources(root)}


def topo(graph: dict[str, list[str]]) -> list[str]:
    order, state = [], {}

    def visit(m: str, stack: tuple[str, ...]):
        if state.get(m) == "done":
            return
        if m in stack:
            raise SystemExit(f"check-lean: FAIL: import cycle {' -> '.join(stack + (m,))}")
        for d in graph.get(m, []):
            visit(d, stack + (m,))
        state[m] = "done"
        order.append(m)

    for m in sorted(graph):
        visit(m, ())
    return order


def closure(graph: dict[str, list[str]], m: str) -> set[str]:
    seen, todo = set(), list(graph.get(m, []))
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(graph.get(d, []))
    return seen


AUDIT_HEAD = r"""
-- ===== audit helpers (generated by .ci/check-lean, not part of the sources)
-- This build's interpreter lacks the code of some library functions (Name.toString, Array folds,
-- String.replace, liftTermElabM), hence the hand-written helpers and the plain recursion.
open Lean in
def kvaAuditName : Name → String
  | .anonymous => "[anonymous]"
  | .str .anonymous s => s
  | .str p s => kvaAuditName p ++ "." ++ s
  | .num p k => kvaAuditName p ++ "." ++ toString k

def kvaAuditJoin : List String → String
  | [] => ""
  | [s] => s
  | s :: ss => s ++ " " ++ kvaAuditJoin ss

def kvaAuditArr {β : Type} (a : Array β) : (i : Nat) → i ≤ a.size → List β → List β
  | 0, _, acc => acc
  | i + 1, h, acc => kvaAuditArr a i (Nat.le_of_succ_le h) (a[i]'(Nat.lt_of_succ_le h) :: acc)

open Lean in
def kvaAuditKind : ConstantInfo → String
  | .axiomInfo _ => "axiom"
  | .defnInfo _ => "def"
  | .thmInfo _ => "theorem"
  | .opaqueInfo _ => "opaque"
  | .quotInfo _ => "quot"
  | .inductInfo _ => "inductive"
  | .ctorInfo _ => "ctor"
  | .recInfo _ => "recursor"

open Lean PersistentHashMap in
/-- every entry of a persistent hash map node (the local constants live in `constants.map₂`) -/
partial def kvaAuditNode (acc : List (Name × ConstantInfo)) :
    Node Name ConstantInfo → List (Name × ConstantInfo)
  | .entries es => go (kvaAuditArr es es.size (Nat.le_refl _) []) acc
  | .collision ks vs _ => zipAll (kvaAuditArr ks ks.size (Nat.le_refl _) [])
      (kvaAuditArr vs vs.size (Nat.le_refl _) []) acc
where
  go : List (Entry Name ConstantInfo (Node Name ConstantInfo)) → List (Name × ConstantInfo) →
      List (Name × ConstantInfo)
    | [], acc => acc
    | .entry k v :: rest, acc => go rest ((k, v) :: acc)
    | .ref n :: rest, acc => go rest (kvaAuditNode acc n)
    | .null :: rest, acc => go rest acc
  zipAll : List Name → List ConstantInfo → List (Name × ConstantInfo) → List (Name × ConstantInfo)
    | k :: ks, v :: vs, acc => zipAll ks vs ((k, v) :: acc)
    | _, _, acc => acc

open Lean in
/-- where a constant comes from: `local` (this file) or the name of the imported module -/
def kvaAuditWhere (env : Environment) (c : Name) : String :=
  match env.getModuleIdxFor? c with
  | some i => match env.header.moduleNames[i.toNat]? with
    | some m => kvaAuditName m
    | none => "?"
  | none => "local"

open Lean in
def kvaAuditUses (env : Environment) : List Name → List String
  | [] => []
  | c :: cs => (kvaAuditName c ++ "@" ++ kvaAuditWhere env c) :: kvaAuditUses env cs

open Lean in
def kvaAuditPrintIn (m : String) : List (Name × ConstantInfo) → IO Unit
  | [] => pure ()
  | (n, _) :: rest => do
    IO.println ("IN " ++ m ++ " " ++ kvaAuditName n)
    kvaAuditPrintIn m rest

open Lean Elab Command in
/-- the local constants declared so far: run after each module, so the report knows each one's module -/
def kvaAuditMark (m : String) : CommandElabM Unit := do
  kvaAuditPrintIn m (kvaAuditNode [] (← getEnv).constants.map₂.root)

open Lean Elab Command in
def kvaAuditOne (n : Name) (ci : ConstantInfo) : CommandElabM Unit := do
  let env ← getEnv
  let axs ← collectAxioms n
  let usedT := ci.type.getUsedConstants
  let usedV := match ci.value? (allowOpaque := true) with
    | some v => v.getUsedConstants
    | none => #[]
  IO.println ("DECL " ++ kvaAuditName n ++ " " ++ kvaAuditKind ci ++
    (if ci.isUnsafe then " unsafe" else " safe"))
  IO.println ("AXIOMS " ++ kvaAuditName n ++ " : " ++
    kvaAuditJoin (kvaAuditUses env (kvaAuditArr axs axs.size (Nat.le_refl _) [])))
  IO.println ("USES " ++ kvaAuditName n ++ " : " ++
    kvaAuditJoin (kvaAuditUses env (kvaAuditArr usedT usedT.size (Nat.le_refl _) [])))
  IO.println ("USES " ++ kvaAuditName n ++ " : " ++
    kvaAuditJoin (kvaAuditUses env (kvaAuditArr usedV usedV.size (Nat.le_refl _) [])))
  if ci matches .thmInfo _ then
    IO.println ("STMT " ++ kvaAuditName n)
    IO.println (toString ci.type)
    IO.println "STMT-END"

open Lean Elab Command in
def kvaAuditAll : List (Name × ConstantInfo) → CommandElabM Unit
  | [] => IO.println "AUDIT-DONE"
  | (n, ci) :: rest => do
    kvaAuditOne n ci
    kvaAuditAll rest
"""

AUDIT_TAIL = r"""
-- ===== audit (generated by .ci/check-lean, not part of the sources)
open Lean Elab Command in
#eval show CommandElabM Unit from do
  kvaAuditAll (kvaAuditNode [] (← getEnv).constants.map₂.root)
"""


def gen(root: pathlib.Path, out: pathlib.Path) -> None:
    """Write the one file: a `module` that imports what the audit needs, then every KvaLean module's
    text in dependency order (its `module`/import lines dropped), then the audit; and beside it
    OUT.json: each module's line range in OUT and its transitive imports."""
    graph = module_graph(root)
    lines = ["module", "import Lean.Elab.Command", "import Lean.Util.CollectAxioms"] + AUDIT_HEAD.splitlines()
    table = {}
    for m in topo(graph):
        path = root / (m.replace(".", "/") + ".lean")
        lines.append(f"-- ===== {m}")
        start = len(lines) + 1
        for s in path.read_text(encoding="utf-8").splitlines():
            lines.append("" if s.strip() == "module" or _IMPORT.match(s) else s)
        table[m] = {"file": str(path.relative_to(root)), "start": start, "end": len(lines),
                    "closure": sorted(closure(graph, m))}
        lines.append(f'#eval kvaAuditMark "{m}"  -- generated by .ci/check-lean')
    lines.append(AUDIT_TAIL)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(table, indent=1), encoding="utf-8")


def parse(log: str) -> tuple[dict, dict]:
    """``(decls, module_of)`` from the audit's lines: per declaration its kind, unsafety, axiom leaves,
    used constants and (theorems) statement; and the module each local constant was declared in (the
    first ``IN`` marker that lists it)."""
    decls, module_of = {}, {}
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("IN "):
            _, m, n = line.split(" ", 2)
            module_of.setdefault(n, m)
        elif line.startswith("DECL "):
            _, n, kind, safe = line.split(" ")
            decls.setdefault(n, {}).update(kind=kind, unsafe=safe == "unsafe")
        elif line.startswith(("AXIOMS ", "USES ")):
            tag, rest = line.split(" ", 1)
            n, _, val = rest.partition(" : ")
            decls.setdefault(n, {}).setdefault(tag.lower(), []).extend(val.split())
        elif line.startswith("STMT "):
            n, body = line[5:], []
            i += 1
            while i < len(lines) and lines[i] != "STMT-END":
                body.append(lines[i].strip())
                i += 1
            decls.setdefault(n, {})["stmt"] = canonical(" ".join(body))
        i += 1
    return decls, module_of


_AUX = re.compile(r"^(_.*|eq_\d+|eq_def|proof_\d+|match_\d+|induct\w*|fun_cases\w*|.*_def)$")


def home(module_of: dict, n: str) -> str | None:
    """The module of a local constant. An auxiliary one (`foo.eq_1`, `foo.proof_2`, `foo.match_1`, …)
    belongs to the module of its parent `foo`: Lean may create it on first use, in a later module."""
    parts = n.split(".")
    while len(parts) > 1 and _AUX.match(parts[-1]) and ".".join(parts[:-1]) in module_of:
        parts.pop()
    return module_of.get(".".join(parts))


_HYG = re.compile(r"([^\s:()\[\]{},]+?)\._@\.[^\s:()\[\]{},]*")


def canonical(stmt: str) -> str:
    """A statement with its hygienic binder names (``inst._@.Check.123._hygCtx._hyg.3``: they carry
    a hash of the file and a counter) renamed ``inst✝1``, ``inst✝2``, … in order of appearance, so
    the pin does not move when unrelated code moves, and still tells the binders apart."""
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"{m.group(1)}✝{len(names) + 1}")

    return _HYG.sub(rename, stmt)


def generated(n: str) -> bool:
    """A declaration of the audit itself (or an auxiliary one of `#eval`), not of the sources."""
    return any(part.startswith("kvaAudit") or part.startswith("_eval") for part in n.split("."))


def report(out: pathlib.Path, log_path: pathlib.Path, expected: pathlib.Path, update: bool) -> int:
    table = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    log = log_path.read_text(encoding="utf-8", errors="replace")
    fails = []
    decls, module_of = parse(log)
    decls = {n: d for n, d in decls.items() if not generated(n)}
    if "AUDIT-DONE" not in log:
        fails.append("the audit did not finish (a Lean error stopped the file earlier?)")
    for n, d in sorted(decls.items()):
        if "kind" not in d:
            continue
        mod = home(module_of, n)
        if d["kind"] == "axiom":
            fails.append(f"{n}: an axiom declared in the sources")
        if d["unsafe"]:
            fails.append(f"{n}: unsafe declaration")
        for leaf in d.get("axioms", []):
            name, _, where = leaf.partition("@")
            if name in ALLOWED_AXIOMS:
                continue
            if where == "local" or name in ("sorryAx", "Lean.ofReduceBool", "Lean.ofReduceNat",
                                            "Lean.trustCompiler"):
                fails.append(f"{n}: depends on the axiom {name}")
            # any other leaf is an imported core-library theorem whose proof this build does not
            # load (imported modules come at the "exported" level); it is trusted as part of Lean
        if mod is None:
            fails.append(f"{n}: could not tell which module declares it")
            continue
        allowed = set(table[mod]["closure"]) | {mod}
        for use in dict.fromkeys(d.get("uses", [])):
            name, _, where = use.partition("@")
            if where == "local":
                um = home(module_of, name)
                if _AUX.match(name.split(".")[-1]) and not generated(name):
                    # auxiliary proofs and matchers: Lean shares identical ones between
                    # declarations of the one file; a module build makes its own
                    continue
                if generated(name):
                    fails.append(f"{n} ({mod}) uses the audit's own {name}")
                elif um is None:
                    fails.append(f"{n} ({mod}) uses {name}, of unknown module")
                elif um not in allowed:
                    fails.append(f"{n} ({mod}) uses {name} from {um}, which {mod} does not import")
                elif um is not None and um != mod and "_private" in name:
                    fails.append(f"{n} ({mod}) uses the private {name} of {um}")
            elif not (where == "Init" or where.startswith("Init.")):
                fails.append(f"{n} ({mod}) uses {name} from {where}: the sources import only Init")
    # pinned statements: every theorem of the sources (private and auxiliary ones aside)
    stmts = {n: d["stmt"] for n, d in decls.items() if "stmt" in d and "_private" not in n
             and not re.search(r"\.(_|proof_|match_|eq_)\w*$", n) and not n.split(".")[-1].startswith("_")}
    text = "".join(f"{n} : {s}\n" for n, s in sorted(stmts.items()))
    if update:
        expected.write_text(text, encoding="utf-8")
        print(f"  wrote {len(stmts)} statements to {expected.name}")
    else:
        want = {}
        for line in expected.read_text(encoding="utf-8").splitlines():
            if line.strip():
                n, _, s = line.partition(" : ")
                want[n] = s
        for n in sorted(want):
            if n not in stmts:
                fails.append(f"pinned theorem {n} is gone")
            elif stmts[n] != want[n]:
                fails.append(f"the statement of {n} changed:\n      pinned: {want[n]}\n      now:    {stmts[n]}")
        for n in sorted(set(stmts) - set(want)):
            fails.append(f"theorem {n} is not pinned in {expected.name} (add it: --update-statements)")
    n_thm = sum(1 for d in decls.values() if d.get("kind") == "theorem")
    leaves = {leaf.partition("@")[0] for d in decls.values() for leaf in d.get("axioms", [])}
    used_ax = sorted(leaves & set(ALLOWED_AXIOMS))
    print(f"  audited {len(decls)} declarations ({n_thm} theorems) in {len(table)} modules; "
          f"allowed axioms reached: {', '.join(used_ax) or 'none'}; {len(leaves - set(ALLOWED_AXIOMS))} "
          f"imported core theorems as leaves (their proofs are not loaded here); "
          f"{len(stmts)} statements pinned")
    for f in fails:
        print(f"  AUDIT-FAIL {f}")
    return 1 if fails else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "scan":
        bad = scan(pathlib.Path(argv[1]))
        for b in bad:
            print(b)
        return 1 if bad else 0
    if len(argv) == 3 and argv[0] == "gen":
        gen(pathlib.Path(argv[1]), pathlib.Path(argv[2]))
        return 0
    if len(argv) in (4, 5) and argv[0] == "report":
        return report(pathlib.Path(argv[1]), pathlib.Path(argv[2]), pathlib.Path(argv[3]),
                      argv[4:] == ["--update"])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
