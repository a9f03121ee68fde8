"""The source scan, the one-file build and the report of ``.ci/check-lean`` (see that script).

    python3 .ci/kvalean_check.py scan ROOT            token scan and module rules; exit 1 on a finding
    python3 .ci/kvalean_check.py gen ROOT OUT.lean    one file: every module in dependency order + audit
    python3 .ci/kvalean_check.py report OUT.lean LOG EXPECTED [--update]
                                                     judge the Lean output of that file

Standard library only (any Python 3.9+).
"""

from __future__ import annotations

import hashlib
import json
import secrets
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
    "run_tac": "run_tac (runs tactic code written in the file)",
    "by_elab": "by_elab (runs elaborator code written in the file)",
    "partial": "a partial definition (the kernel replay skips it)",
    "opaque": "an opaque constant (its value is hidden from the kernel's definitional unfolding)",
    "local_notation": "a notation (a macro)",
    "#eval": "#eval",
    "#exit": "#exit (stops checking the file)",
    "example": "an example (anonymous: nothing can audit it; state it as a named theorem)",
}
# Lean.* names the sources may use (the rest of that namespace is meta code); options they may set
LEAN_ALLOWED = ("Grind",)
OPTIONS_ALLOWED = ("maxHeartbeats", "maxRecDepth", "synthInstance.maxHeartbeats")
_ID = r"[A-Za-z_\u00C0-\uFFFF][\w'!?\u00C0-\uFFFF]*"
_TOKEN = re.compile(r"#?" + _ID + r"(?:\." + _ID + r")*")
_IMPORT = re.compile(r"^\s*((?:public\s+)?(?:meta\s+)?import)\s+(\S+)")


_RAW = re.compile(r'r(#*)"')


def _idchar(ch: str) -> bool:
    return ch.isalnum() or ch in "_'!?.\u00AB\u00BB"


def strip(src: str, found: list | None = None) -> str:
    """``src`` with comments (nested ``/- -/``, ``--``), string and char literals blanked; newlines kept.
    Raw strings (``r"…"``, ``r#"…"#``) are read as Lean reads them (no escapes). When ``found`` is a
    list, each raw or interpolated (``s!"…"``) string is appended to it as ``(line, why)``: the sources
    may use neither."""
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
        elif (m := _RAW.match(src, i)) and (i == 0 or not _idchar(src[i - 1])):
            # a raw string r"…", r#"…"#: no escapes, ends at the quote followed by as many #
            end = src.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            if found is not None:
                found.append((src.count("\n", 0, i) + 1, "a raw string literal (write plain strings)"))
            out.append(blank(src[i:j]))
            i = j
        elif c == '"':
            if found is not None and i > 0 and src[i - 1] == "!":
                found.append((src.count("\n", 0, i) + 1,
                              "an interpolated string (s!/m!/f!: its {…} parts are code)"))
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(blank(src[i:j + 1]))
            i = j + 1
        elif c == "'" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] in "_'!?")):
            mc = re.match(r"'(\\[^']*|[^\\'])'", src[i:i + 12])
            out.append(blank(mc.group(0)) if mc else c)
            i += len(mc.group(0)) if mc else 1
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
        found: list = []
        lines, shown = strip(raw, found).splitlines(), raw.splitlines()
        for ln, why in found:
            bad.append(f"{rel}:{ln}: {why}: {shown[ln - 1].strip()[:110]}")
        for ln, line in enumerate(lines, 1):
            hit = None
            if "\u00AB" in line or "\u00BB" in line:
                hit = "a «quoted» name (write names plainly)"
            for m in _TOKEN.finditer(line):
                parts = m.group(0).lstrip("#").split(".")
                if parts[0] == "_root_":
                    parts = parts[1:]
                if parts and parts[0] == "Lean" and parts[1:2] not in ([p] for p in LEAN_ALLOWED):
                    hit = (f"the Lean namespace ({m.group(0)}): only "
                           f"{', '.join('Lean.' + a for a in LEAN_ALLOWED)} may be named")
                    break
            so = re.match(r"^\s*set_option\s+(\S+)", line) or re.search(r"\bset_option\s+(\S+)", line)
            if so and not (so.group(1).startswith("linter.") or so.group(1) in OPTIONS_ALLOWED):
                hit = f"set_option {so.group(1)} (only linter.* and {', '.join(OPTIONS_ALLOWED)} may be set)"
            for m in _TOKEN.finditer(line) if not hit else ():
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
def kvaAuditPrintIn (tag m : String) : List (Name × ConstantInfo) → IO Unit
  | [] => pure ()
  | (n, _) :: rest => do
    IO.println (tag ++ " IN " ++ m ++ " " ++ kvaAuditName n)
    kvaAuditPrintIn tag m rest

open Lean Elab Command in
/-- the local constants declared so far: run after each module, so the report knows each one's module -/
def kvaAuditMark (tag m : String) : CommandElabM Unit := do
  kvaAuditPrintIn tag m (kvaAuditNode [] (← getEnv).constants.map₂.root)

open Lean in
/-- how a declaration was made, as far as the environment records it: `ctor`/`recursor` (by its
inductive type), `auxrec` (casesOn, recOn, brecOn, …: `isAuxRecursor`), `noconf` (noConfusion),
`matcher` (a `match` compiled to an auxiliary function: its matcher info), else `elab` -/
def kvaAuditMade (env : Environment) (n : Name) (ci : ConstantInfo) : String :=
  match ci with
  | .ctorInfo _ => "ctor"
  | .recInfo _ => "recursor"
  | _ =>
    if isAuxRecursor env n then "auxrec"
    else if isNoConfusion env n then "noconf"
    else if Meta.isMatcherCore env n then "matcher"
    else "elab"

open Lean in
def kvaAuditTypes : List Name → Environment → List String
  | [], _ => []
  | c :: cs, env => (kvaAuditName c ++ " : " ++ (match env.find? c with
      | some ci => toString ci.type
      | none => "?")) :: kvaAuditTypes cs env

def kvaAuditLines : List String → String
  | [] => ""
  | [s] => s
  | s :: ss => s ++ "\n" ++ kvaAuditLines ss

open Lean Elab Command in
def kvaAuditOne (tag : String) (n : Name) (ci : ConstantInfo) : CommandElabM Unit := do
  let env ← getEnv
  let axs ← collectAxioms n
  let usedT := ci.type.getUsedConstants
  let usedV := match ci.value? (allowOpaque := true) with
    | some v => v.getUsedConstants
    | none => #[]
  let made := kvaAuditMade env n ci
  IO.println (tag ++ " DECL " ++ kvaAuditName n ++ " " ++ kvaAuditKind ci ++
    (if ci.isUnsafe then " unsafe" else if ci.isPartial then " partial" else " safe") ++ " " ++ made)
  IO.println (tag ++ " AXIOMS " ++ kvaAuditName n ++ " : " ++
    kvaAuditJoin (kvaAuditUses env (kvaAuditArr axs axs.size (Nat.le_refl _) [])))
  IO.println (tag ++ " USES " ++ kvaAuditName n ++ " : " ++
    kvaAuditJoin (kvaAuditUses env (kvaAuditArr usedT usedT.size (Nat.le_refl _) [])))
  IO.println (tag ++ " USES " ++ kvaAuditName n ++ " : " ++
    kvaAuditJoin (kvaAuditUses env (kvaAuditArr usedV usedV.size (Nat.le_refl _) [])))
  if made == "elab" then
    IO.println (tag ++ " STMT " ++ kvaAuditName n)
    IO.println (toString ci.type)
    IO.println (tag ++ " STMT-END")
    -- the meaning of a definition is its value; of an inductive type, its constructors
    let body := match ci with
      | .defnInfo v => some (toString v.value)
      | .opaqueInfo v => some (toString v.value)
      | .inductInfo v => some (kvaAuditLines (kvaAuditTypes v.ctors env))
      | _ => none
    if let some b := body then
      IO.println (tag ++ " VALUE " ++ kvaAuditName n)
      IO.println b
      IO.println (tag ++ " VALUE-END")

open Lean Elab Command in
def kvaAuditAll (tag : String) : List (Name × ConstantInfo) → CommandElabM Unit
  | [] => IO.println (tag ++ " AUDIT-DONE")
  | (n, ci) :: rest => do
    kvaAuditOne tag n ci
    kvaAuditAll tag rest

-- ----- kernel replay: every local declaration again, into an environment that imports only Init,
-- each one sent to the kernel (core's Lean.Environment.replay, one declaration at a time, in
-- dependency order, so that one rejected declaration does not hide the others)

/-- a declaration of the audit itself, or an auxiliary one of `#eval` -/
def kvaAuditOwn : Lean.Name → Bool
  | .anonymous => false
  | .str p s => s.startsWith "kvaAudit" || s.startsWith "_eval" || kvaAuditOwn p
  | .num p _ => kvaAuditOwn p

open Lean in
def kvaAuditLocals (env : Environment) : List (Name × ConstantInfo) → List Name
  | [] => []
  | (n, _) :: rest =>
    if kvaAuditOwn n then kvaAuditLocals env rest else n :: kvaAuditLocals env rest

def kvaAuditApp {β : Type} : List β → List β → List β
  | [], ys => ys
  | x :: xs, ys => x :: kvaAuditApp xs ys

open Lean in
def kvaAuditUsed (ci : ConstantInfo) : List Name :=
  let t := ci.type.getUsedConstants
  let v := match ci.value? (allowOpaque := true) with
    | some v => v.getUsedConstants
    | none => #[]
  kvaAuditArr t t.size (Nat.le_refl _) (kvaAuditArr v v.size (Nat.le_refl _) [])

open Lean in
def kvaAuditUsedAll (env : Environment) : List Name → List Name
  | [] => []
  | c :: cs => kvaAuditApp (match env.find? c with
      | some cc => kvaAuditUsed cc
      | none => []) (kvaAuditUsedAll env cs)

open Lean in
def kvaAuditCtorsOf (env : Environment) : List Name → List Name
  | [] => []
  | m :: ms => kvaAuditApp (match env.find? m with
      | some (.inductInfo w) => w.ctors
      | _ => []) (kvaAuditCtorsOf env ms)

open Lean in
/-- the names a declaration needs first: what its type and value use, and for an inductive type
also what the types of its mutual block and their constructors use -/
def kvaAuditDeps (env : Environment) (ci : ConstantInfo) : List Name :=
  match ci with
  | .inductInfo v => kvaAuditApp (kvaAuditUsed ci) (kvaAuditUsedAll env (kvaAuditApp v.all (kvaAuditCtorsOf env v.all)))
  | _ => kvaAuditUsed ci

open Lean in
/-- post-order of the local declarations reachable from `todo` (dependencies first, reversed) -/
partial def kvaAuditOrder (env : Environment) (locals : NameSet) :
    List Name → NameSet × List Name → NameSet × List Name
  | [], st => st
  | n :: rest, (seen, out) =>
    if seen.contains n || !locals.contains n then kvaAuditOrder env locals rest (seen, out) else
    match env.find? n with
    | none => kvaAuditOrder env locals rest (seen, out)
    | some ci =>
      let (seen', out') := kvaAuditOrder env locals (kvaAuditDeps env ci) (seen.insert n, out)
      kvaAuditOrder env locals rest (seen', n :: out')

open Lean in
def kvaAuditSet : List Name → NameSet → NameSet
  | [], s => s
  | n :: ns, s => kvaAuditSet ns (s.insert n)

def kvaAuditRev {β : Type} : List β → List β → List β
  | [], acc => acc
  | x :: xs, acc => kvaAuditRev xs (x :: acc)

open Lean in
/-- the inductive types of a mutual block, for the kernel: each with its constructors' types as
elaborated (the kernel makes the constructors and recursors again; they are compared below) -/
def kvaAuditIndTypes (env : Environment) : List Name → List InductiveType
  | [] => []
  | m :: ms => match env.find? m with
    | some (.inductInfo w) =>
      { name := m, type := w.type,
        ctors := kvaAuditCtorTypes env w.ctors } :: kvaAuditIndTypes env ms
    | _ => kvaAuditIndTypes env ms
where
  kvaAuditCtorTypes (env : Environment) : List Name → List Constructor
    | [] => []
    | c :: cs => match env.find? c with
      | some cc => { name := c, type := cc.type } :: kvaAuditCtorTypes env cs
      | none => kvaAuditCtorTypes env cs

open Lean in
/-- one declaration into the fresh kernel environment: definitions, theorems, opaques and inductive
blocks go through the kernel's `addDecl` (no options: `debug.skipKernelTC` is off); constructors and
recursors, which the kernel made with their inductive type, must equal the elaborated ones -/
def kvaAuditReplayOne (env : Environment) (k : Kernel.Environment) (n : Name) :
    ConstantInfo → Except String Kernel.Environment
  | .defnInfo v => kvaAuditAdd k (.defnDecl v)
  | .thmInfo v => kvaAuditAdd k (.thmDecl v)
  | .opaqueInfo v => kvaAuditAdd k (.opaqueDecl v)
  | .axiomInfo v => kvaAuditAdd k (.axiomDecl v)
  | .quotInfo _ => .error "a quotient declaration"
  | .inductInfo v =>
    if (k.find? n).isSome then .ok k  -- added with an earlier member of its mutual block
    else kvaAuditAdd k (.inductDecl v.levelParams v.numParams (kvaAuditIndTypes env v.all) v.isUnsafe)
  | .ctorInfo v => match k.find? n with
    | some (.ctorInfo w) => if v == w then .ok k else .error "differs from the constructor the kernel makes"
    | _ => .error "the kernel made no such constructor"
  | .recInfo v => match k.find? n with
    | some (.recInfo w) => if v == w then .ok k else .error "differs from the recursor the kernel makes"
    | _ => .error "the kernel made no such recursor"
where
  kvaAuditAdd (k : Kernel.Environment) (d : Declaration) : Except String Kernel.Environment :=
    match k.addDecl {} d with
    | .ok k' => .ok k'
    | .error _ => .error "the kernel rejects it"

open Lean in
def kvaAuditReplayAll (tag : String) (env : Environment) :
    List Name → Kernel.Environment → Nat → Nat → IO Unit
  | [], _, ok, bad => IO.println (tag ++ " REPLAY-DONE " ++ toString ok ++ " " ++ toString bad)
  | n :: rest, k, ok, bad => do
    match env.find? n with
    | none => kvaAuditReplayAll tag env rest k ok bad
    | some ci =>
      if ci.isUnsafe || ci.isPartial then
        -- not for the kernel (core's replay skips them too); a safe declaration that used one
        -- would be rejected below, and the audit judges them
        IO.println (tag ++ " REPLAY-SKIP " ++ kvaAuditName n)
        kvaAuditReplayAll tag env rest k ok bad
      else
      match kvaAuditReplayOne env k n ci with
      | .ok k' =>
        IO.println (tag ++ " REPLAY-OK " ++ kvaAuditName n)
        kvaAuditReplayAll tag env rest k' (ok + 1) bad
      | .error e =>
        IO.println (tag ++ " REPLAY-FAIL " ++ kvaAuditName n)
        IO.println e
        kvaAuditReplayAll tag env rest k ok (bad + 1)

open Lean Elab Command in
def kvaAuditReplay (tag : String) : CommandElabM Unit := do
  let env ← getEnv
  let t0 ← IO.monoMsNow
  let fresh ← importModules #[{ module := `Init }] {} (level := .exported)
  let t1 ← IO.monoMsNow
  let locals := kvaAuditLocals env (kvaAuditNode [] env.constants.map₂.root)
  let (_, order) := kvaAuditOrder env (kvaAuditSet locals {}) locals ({}, [])
  kvaAuditReplayAll tag env (kvaAuditRev order []) fresh.toKernelEnv 0 0
  let t2 ← IO.monoMsNow
  IO.println (tag ++ " REPLAY-TIME import " ++ toString (t1 - t0) ++ " ms, kernel " ++
    toString (t2 - t1) ++ " ms")
"""

AUDIT_TAIL = r"""
-- ===== audit (generated by .ci/check-lean, not part of the sources)
open Lean Elab Command in
#eval show CommandElabM Unit from do
  kvaAuditAll "@TAG@" (kvaAuditNode [] (← getEnv).constants.map₂.root)
  kvaAuditReplay "@TAG@"
"""


def gen(root: pathlib.Path, out: pathlib.Path) -> None:
    """Write the one file: a `module` that imports what the audit needs, then every KvaLean module's
    text in dependency order (its `module`/import lines dropped), then the audit; and beside it
    OUT.json: each module's line range in OUT and its transitive imports, and the run's random tag
    (every audit line starts with it, so no other output can pass for one)."""
    graph = module_graph(root)
    tag = "KVA" + secrets.token_hex(12)
    lines = ["module", "import Lean.Elab.Command", "import Lean.Util.CollectAxioms",
             ] + AUDIT_HEAD.splitlines()
    table = {}
    for m in topo(graph):
        path = root / (m.replace(".", "/") + ".lean")
        lines.append(f"-- ===== {m}")
        start = len(lines) + 1
        for s in path.read_text(encoding="utf-8").splitlines():
            lines.append("" if s.strip() == "module" or _IMPORT.match(s) else s)
        table[m] = {"file": str(path.relative_to(root)), "start": start, "end": len(lines),
                    "closure": sorted(closure(graph, m))}
        lines.append(f'#eval kvaAuditMark "{tag}" "{m}"  -- generated by .ci/check-lean')
    lines.append(AUDIT_TAIL.replace("@TAG@", tag))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"tag": tag, "modules": table}, indent=1),
                                        encoding="utf-8")


def parse(log: str, tag: str) -> tuple[dict, dict, dict]:
    """``(decls, module_of, replay)`` from the audit's lines (those that start with the run's tag): per
    declaration its kind, safety, how it was made, axiom leaves, used constants, statement and (for
    definitions and inductive types) value; the module each local constant was declared in (the first
    ``IN`` marker that lists it); and the kernel replay's verdict per declaration."""
    decls, module_of, replay = {}, {}, {"ok": set(), "skip": set(), "fail": {}, "done": None, "time": ""}
    lines = log.splitlines()
    pre = tag + " "
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(pre):
            i += 1
            continue
        line = line[len(pre):]
        if line.startswith("IN "):
            _, m, n = line.split(" ", 2)
            module_of.setdefault(n, m)
        elif line.startswith("DECL "):
            _, n, kind, safe, made = line.split(" ")
            decls.setdefault(n, {}).update(kind=kind, safety=safe, made=made)
        elif line.startswith(("AXIOMS ", "USES ")):
            key, rest = line.split(" ", 1)
            n, _, val = rest.partition(" : ")
            decls.setdefault(n, {}).setdefault(key.lower(), []).extend(val.split())
        elif line.startswith(("STMT ", "VALUE ")):
            key, n = line.split(" ", 1)
            body = []
            i += 1
            while i < len(lines) and lines[i] != f"{pre}{key}-END":
                body.append(lines[i].strip())
                i += 1
            decls.setdefault(n, {})[key.lower()] = canonical(" ".join(body))
        elif line.startswith("REPLAY-SKIP "):
            replay["skip"].add(line.split(" ", 1)[1])
        elif line.startswith("REPLAY-OK "):
            replay["ok"].add(line.split(" ", 1)[1])
        elif line.startswith("REPLAY-FAIL "):
            n, msg = line.split(" ", 1)[1], []
            while i + 1 < len(lines) and not lines[i + 1].startswith(pre) and len(msg) < 3:
                i += 1
                msg.append(lines[i].strip())
            replay["fail"][n] = " ".join(msg)[:200]
        elif line.startswith("REPLAY-DONE "):
            replay["done"] = tuple(int(x) for x in line.split()[1:3])
        elif line.startswith("REPLAY-TIME "):
            replay["time"] = line.split(" ", 1)[1]
        i += 1
    return decls, module_of, replay


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


def value_hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


# what the elaborator adds beside a declaration `P` as `P.<suffix>` (equation lemmas, nested proofs
# abstracted by abstractNestedProofs, structure and inductive lemmas, realized congruence lemmas)
_MADE_SUFFIX = re.compile(r"^(_?proof_\d+(?:_\d+)*|eq_\d+|eq_def|inj|injEq|sizeOf_spec|_sizeOf_\d+|_sizeOf_inst|"
                          r"congr_simp|induct|induct_unfolding|fun_cases|fun_cases_unfolding|"
                          r"_unary|_binary|_mutual|_sunfold|_flat_ctor)$")
_PRIVATE = re.compile(r"^_private\.[^.]+(?:\.[^.0-9][^.]*)*?\.0\.")


def made_from_parent(n: str, decls: dict) -> bool:
    """Whether the elaborator made ``n`` from a parent declaration ``P``, told by its place and its
    terms, not by its name alone: ``n`` is ``P.<suffix>`` for a suffix the elaborator uses, ``P``
    exists, and either a proof refers to ``n`` (a nested proof that abstractNestedProofs moved out
    of ``P``, ``P.proof_k``) or ``n``'s statement or proof refers to ``P`` (equation, injectivity,
    sizeOf and congruence lemmas about ``P``), or ``n`` is ``P``'s smart-unfolding copy or flat
    constructor. A theorem the sources name
    ``aux.proof_7`` without such a parent is pinned like any other."""
    base = _PRIVATE.sub("", n)
    prefix = n[: len(n) - len(base)]
    parent, _, suffix = base.rpartition(".")
    if not parent or not _MADE_SUFFIX.match(suffix):
        return False
    uses = {u.partition("@")[0] for u in decls.get(n, {}).get("uses", [])}
    for cand in {parent, prefix + parent} - {""}:
        p = decls.get(cand)
        if suffix.lstrip("_").startswith("proof_"):
            # the parent exists and some proof refers to it (the one it was moved out of, or, where
            # Lean shares identical auxiliary proofs in the one file, another one)
            if p is not None and suffix.startswith("_proof_"):
                return True  # an auxiliary lemma of P's proof (grind, omega), used or not
            if p is not None and any(n in {u.partition("@")[0] for u in d.get("uses", [])}
                                     for m, d in decls.items() if m != n):
                return True
        elif cand in uses:
            return True
        elif p is not None and suffix in ("_sunfold", "_flat_ctor"):
            return True  # smart-unfolding copy of a recursive definition; flat constructor
    return False


def compiled_copy(n: str, decls: dict) -> bool:
    """``P._unsafe_rec``: the partial copy of a recursive definition ``P`` that Lean makes for the
    compiler (the kernel checks ``P``; nothing safe may use the copy, or the kernel rejects it)."""
    parent, _, last = n.rpartition(".")
    p = decls.get(parent, {})
    return last == "_unsafe_rec" and p.get("kind") == "def" and p.get("safety") == "safe"


def pins(decls: dict) -> dict[str, str]:
    """What is pinned: every declaration the sources declare (private ones included), by its
    statement (``name : type``) and, for a definition or an inductive type, by a hash of its
    elaborated value or constructors (``name := sha256``). Constructors, recursors,
    casesOn/recOn/brecOn/below, noConfusion and matchers (told by the environment) and what the
    elaborator makes beside a parent declaration (:func:`made_from_parent`) are not pinned
    themselves: they follow from their pinned parent."""
    out = {}
    for n, d in decls.items():
        if d.get("made") != "elab" or made_from_parent(n, decls) or compiled_copy(n, decls):
            continue
        if "stmt" in d:
            out[f"{n} :"] = d["stmt"]
        if "value" in d:
            out[f"{n} :="] = value_hash(d["value"])
    return out


def report(out: pathlib.Path, log_path: pathlib.Path, expected: pathlib.Path, update: bool) -> int:
    info = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    table, tag = info["modules"], info["tag"]
    log = log_path.read_text(encoding="utf-8", errors="replace")
    fails = []
    decls, module_of, replay = parse(log, tag)
    decls = {n: d for n, d in decls.items() if not generated(n)}
    if f"{tag} AUDIT-DONE" not in log.splitlines():
        fails.append("the audit did not finish (a Lean error stopped the file earlier?)")
    if replay["done"] is None:
        fails.append("the kernel replay did not finish")
    for n, msg in sorted(replay["fail"].items()):
        if not generated(n):
            fails.append(f"{n}: the kernel rejects it on replay into a fresh environment: {msg}")
    for n, d in sorted(decls.items()):
        if "kind" not in d:
            continue
        code_only = d["safety"] == "partial" and compiled_copy(n, decls)
        if (replay["done"] is not None and n not in replay["ok"] and n not in replay["fail"]
                and not code_only):
            fails.append(f"{n}: not replayed through the kernel")
        mod = home(module_of, n)
        if d["kind"] == "axiom":
            fails.append(f"{n}: an axiom declared in the sources")
        if d["safety"] != "safe" and not code_only:
            fails.append(f"{n}: {d['safety']} declaration (the kernel does not check it)")
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
    have = pins(decls)
    text = "".join(f"{k} {v}\n" for k, v in sorted(have.items()))
    if update:
        expected.write_text(text, encoding="utf-8")
        print(f"  wrote {len(have)} pins to {expected.name}")
    else:
        want = {}
        for line in expected.read_text(encoding="utf-8").splitlines():
            if line.strip():
                n, sep, v = line.partition(" :")
                if v.startswith("= "):
                    want[n + " :="] = v[2:]
                else:
                    want[n + " :"] = v[1:]
        for k in sorted(want):
            n, what = k.rsplit(" ", 1)
            what = "statement" if what == ":" else "value"
            if k not in have:
                fails.append(f"pinned {what} of {n} is gone")
            elif have[k] != want[k]:
                fails.append(f"the {what} of {n} changed:\n      pinned: {want[k][:400]}\n      now:    {have[k][:400]}")
        for k in sorted(set(have) - set(want)):
            n, what = k.rsplit(" ", 1)
            what = "statement" if what == ":" else "value"
            fails.append(f"the {what} of {n} is not pinned in {expected.name} (add it: --update-statements)")
    n_thm = sum(1 for d in decls.values() if d.get("kind") == "theorem")
    leaves = {leaf.partition("@")[0] for d in decls.values() for leaf in d.get("axioms", [])}
    used_ax = sorted(leaves & set(ALLOWED_AXIOMS))
    n_stmt = sum(1 for k in have if k.endswith(" :"))
    print(f"  audited {len(decls)} declarations ({n_thm} theorems) in {len(table)} modules; "
          f"allowed axioms reached: {', '.join(used_ax) or 'none'}; {len(leaves - set(ALLOWED_AXIOMS))} "
          f"imported core theorems as leaves (their proofs are not loaded here); "
          f"{n_stmt} statements and {len(have) - n_stmt} values pinned")
    if replay["done"] is not None:
        print(f"  kernel replay into a fresh environment (Init only): {replay['done'][0]} accepted, "
              f"{replay['done'][1]} rejected ({replay['time']})")
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
