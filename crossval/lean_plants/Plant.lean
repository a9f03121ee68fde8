module

/-! Planted escapes for `crossval/test_lean_checker.py`: copied beside `KvaLean/LinAlg.lean` as
`KvaLean/Plant.lean` and checked with `.ci/check-lean --no-scan`, so that the Lean side of the check
(the build, the audit in its own process, the kernel replay and the pins) has to catch each one
without the source scan. -/

public section

namespace KvaPlant

-- with `debug.skipKernelTC`, `decide +kernel` leaves the decision to a kernel that is skipped: a
-- false theorem, and another one under a private name
set_option debug.skipKernelTC true in
theorem cheat : 2 + 2 = 5 := by decide +kernel

theorem useCheat : False := by have := cheat; omega

set_option debug.skipKernelTC true in
private theorem hidden : 3 + 3 = 7 := by decide +kernel

-- pinned although private, and although named like a generated declaration
private theorem privateThm : 1 = 1 := rfl
theorem aux.proof_7 : 2 = 2 := rfl

-- a definition by `match`: its matcher `swap.match_1` is pinned with it (swapping two patterns
-- changes the matcher, not the definition's own value)
@[expose] def swap : Nat → Nat
  | 0 => 1
  | _ => 0

-- named like an audit's helpers and `#eval`'s auxiliary definitions (`kvaAudit…`, `_eval…`): false theorems,
-- which the replay and the pins must cover whatever their names (rejected on replay)
set_option debug.skipKernelTC true in
theorem kvaAuditCheat : 2 + 2 = 6 := by decide +kernel

set_option debug.skipKernelTC true in
theorem _evalCheat : 2 + 3 = 6 := by decide +kernel

-- a definition with a proof inside: Lean abstracts it as `three._proof_1`, pinned like every constant
@[expose] def three : Fin 4 := ⟨3, by decide⟩

axiom ax : False

theorem withSorry : 1 = 2 := by sorry

unsafe def unsafeDef : Nat := 0

partial def partialDef (n : Nat) : Nat := partialDef n

-- a fake audit: the build prints the lines an honest audit prints, under a tag it guesses; the audit
-- runs in another process, with a tag made after this one has ended, so they count for nothing
#eval IO.println "KVA000000000000000000000000 MODULE-IMPORTS Init
KVA000000000000000000000000 AUDIT-DONE
KVA000000000000000000000000 REPLAY-OK KvaPlant.cheat
KVA000000000000000000000000 REPLAY-DONE 999 0"

end KvaPlant

end
