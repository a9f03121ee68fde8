module

/-! Planted escapes for `crossval/test_lean_checker.py`: copied into a copy of the sources as
`KvaLean/Plant.lean` and checked with `.ci/check-lean --no-scan`, so that the Lean side of the check
(the kernel replay, the audit and the pins) has to catch each one without the token scan. -/

public section

namespace KvaPlant

-- with `debug.skipKernelTC`, `decide +kernel` leaves the decision to a kernel that is skipped: a
-- false theorem, and another one under a private name. (Meta code that adds a declaration without
-- the kernel, `by_elab` or `#eval`, does not elaborate in this build, where the elaborator's
-- monads are not visible to a module; the source scan refuses it.)
set_option debug.skipKernelTC true in
theorem cheat : 2 + 2 = 5 := by decide +kernel

theorem useCheat : False := by have := cheat; omega

set_option debug.skipKernelTC true in
private theorem hidden : 3 + 3 = 7 := by decide +kernel

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
