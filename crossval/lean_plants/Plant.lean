module

/-! Planted escapes for `crossval/test_lean_checker.py`: copied into a copy of the sources as
`KvaLean/Plant.lean` and checked with `.ci/check-lean --no-scan`, so that the Lean side of the check
(the kernel replay, the audit and the pins) has to catch each one without the token scan. -/

public section

namespace KvaPlant

-- meta code adds a theorem of `False` with `debug.skipKernelTC`: the kernel never sees it; a
-- theorem then uses it. (`by_elab`, the other way to run such code inside a declaration, does not
-- elaborate in this build: its monad is not visible to a module; the source scan refuses it.)
open Lean Elab Command in
#eval show CommandElabM Unit from do
  let d : Declaration := .thmDecl { name := `KvaPlant.cheat, levelParams := [], type := mkConst ``False, value := mkConst ``True.intro }
  match (← getEnv).toKernelEnv.addDecl (({} : Options).setBool `debug.skipKernelTC true) d with
  | .ok k => setEnv (Environment.ofKernelEnv k)
  | .error _ => IO.println "plant: not added"

theorem useCheat : False := cheat

-- the same under a private name
open Lean Elab Command in
#eval show CommandElabM Unit from do
  let n := mkPrivateName (← getEnv) `KvaPlant.hidden
  let d : Declaration := .thmDecl { name := n, levelParams := [], type := mkConst ``False, value := mkConst ``True.intro }
  match (← getEnv).toKernelEnv.addDecl (({} : Options).setBool `debug.skipKernelTC true) d with
  | .ok k => setEnv (Environment.ofKernelEnv k)
  | .error _ => IO.println "plant: not added"

-- pinned although private, and although named like a generated declaration
private theorem privateThm : 1 = 1 := rfl
theorem aux.proof_7 : 2 = 2 := rfl

axiom ax : False

theorem withSorry : 1 = 2 := by sorry

unsafe def unsafeDef : Nat := 0

partial def partialDef (n : Nat) : Nat := partialDef n

-- fake audit lines: without the run's tag they count for nothing, and they hide no error
open Lean Elab Command in
#eval show CommandElabM Unit from do
  IO.println "STMT KvaPlant.useCheat"
  IO.println "AUDIT-DONE"
  IO.println "KVA0123 REPLAY-OK KvaPlant.cheat"

end KvaPlant

end
