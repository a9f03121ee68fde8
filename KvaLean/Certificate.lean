module

public import KvaLean.Ridge

public section

namespace KvaLean

open Lean.Grind

/-! ## Exact rational certificates for the ridge solve

A `RidgeInstance` is one exact instance of the multi-output ridge problem over `Rat`: data
`X` (`m` rows of `d` entries), targets `Y` (`m` rows of `p` entries), prior `W0` (`d` rows of `p`
entries, the identity in RidgeFill), `lam` and a claimed solution `W` (`d` rows of `p` entries).
Matrices are row-major `List (List Rat)`. `RidgeInstance.check` verifies the shapes, `lam ≥ 0` and
the normal equations `(XᵀX + λI) W = XᵀY + λ W0` exactly; `RidgeInstance.optimal_of_check` turns a
successful check into the optimality theorem for that instance. -/

/-- Entry `j` of a list, `0` when out of range. -/
@[expose] def listGet : List Rat → Nat → Rat
  | [], _ => 0
  | a :: _, 0 => a
  | _ :: as, n + 1 => listGet as n

/-- Entry `(i, j)` of a row-major matrix, `0` when out of range. -/
@[expose] def listGet2 : List (List Rat) → Nat → Nat → Rat
  | [], _, _ => 0
  | r :: _, 0, j => listGet r j
  | _ :: rs, i + 1, j => listGet2 rs i j

/-- Length of a list of rationals. -/
@[expose] def lenQ : List Rat → Nat
  | [] => 0
  | _ :: as => lenQ as + 1

/-- `shapeOk A r c`: `A` has exactly `r` rows, each with exactly `c` entries. -/
@[expose] def shapeOk : List (List Rat) → Nat → Nat → Bool
  | [], r, _ => r == 0
  | row :: rows, r, c => lenQ row == c && r != 0 && shapeOk rows (r - 1) c

/-- `allFin n p` checks `p i` for every `i : Fin n`. -/
@[expose] def allFin : (n : Nat) → (Fin n → Bool) → Bool
  | 0, _ => true
  | n + 1, p => allFin n (fun i => p i.castSucc) && p (Fin.last n)

/-- `allFin` is sound. Used by `RidgeInstance.check_sound` (`ridgefill.certify.check_certificate`). -/
theorem allFin_spec : ∀ {n : Nat} {p : Fin n → Bool}, allFin n p = true → ∀ i, p i = true
  | 0, _, _, i => i.elim0
  | n + 1, p, h, i => by
    have h' : (allFin n (fun i => p i.castSucc) && p (Fin.last n)) = true := h
    rw [Bool.and_eq_true] at h'
    rcases fin_cases_last i with ⟨j, rfl⟩ | rfl
    · exact allFin_spec (p := fun i => p i.castSucc) h'.1 j
    · exact h'.2

/-- One exact instance of the multi-output ridge problem (see the module docstring). This is the
data format written by `ridgefill.certify.export_lean_certificate`. -/
structure RidgeInstance where
  /-- Number of calibration rows. -/
  m : Nat
  /-- Input dimension (rows of `W`). -/
  d : Nat
  /-- Output dimension (columns of `W`). -/
  p : Nat
  /-- Data `X`: `m` rows of `d` entries (`h_S` rows). -/
  X : List (List Rat)
  /-- Targets `Y`: `m` rows of `p` entries (the layer inputs `x_l`). -/
  Y : List (List Rat)
  /-- Prior `W0`: `d` rows of `p` entries (the identity in RidgeFill). -/
  W0 : List (List Rat)
  /-- Ridge parameter `λ`. -/
  lam : Rat
  /-- Claimed solution `W`: `d` rows of `p` entries. -/
  W : List (List Rat)

namespace RidgeInstance

/-- `X` as a function. -/
@[expose] def Xf (c : RidgeInstance) : Fin c.m → Fin c.d → Rat := fun k i => listGet2 c.X k.val i.val
/-- `Y` as a function. -/
@[expose] def Yf (c : RidgeInstance) : Fin c.m → Fin c.p → Rat := fun k j => listGet2 c.Y k.val j.val
/-- `W0` as a function. -/
@[expose] def W0f (c : RidgeInstance) : Fin c.d → Fin c.p → Rat := fun i j => listGet2 c.W0 i.val j.val
/-- `W` as a function. -/
@[expose] def Wf (c : RidgeInstance) : Fin c.d → Fin c.p → Rat := fun i j => listGet2 c.W i.val j.val

/-- Row `i`, column `j` of the normal equations holds exactly. -/
@[expose] noncomputable def entryOk (c : RidgeInstance) (j : Fin c.p) (i : Fin c.d) : Bool :=
  decide (matTVec c.Xf (matVec c.Xf (col c.Wf j)) i + c.lam * col c.Wf j i =
    matTVec c.Xf (col c.Yf j) i + c.lam * col c.W0f j i)

/-- The certificate checker (`ridgefill.certify.check_certificate` in Lean): shapes, `λ ≥ 0`, and
the normal equations `(XᵀX + λI) W = XᵀY + λ W0` checked exactly over `Rat`. -/
@[expose] noncomputable def check (c : RidgeInstance) : Bool :=
  shapeOk c.X c.m c.d && shapeOk c.Y c.m c.p && shapeOk c.W0 c.d c.p && shapeOk c.W c.d c.p &&
    decide (0 ≤ c.lam) && allFin c.p (fun j => allFin c.d (fun i => c.entryOk j i))

/-- The ridge objective of the instance at `V`: `‖X V − Y‖²_F + λ ‖V − W0‖²_F`. -/
@[expose] noncomputable def obj (c : RidgeInstance) (V : Fin c.d → Fin c.p → Rat) : Rat :=
  ridgeObjMulti c.Xf c.Yf c.W0f c.lam V

/-- **Soundness of the checker.** If `check c = true` then `λ ≥ 0` and `W` solves the normal
equations of the instance. Constrains `ridgefill.certify.check_certificate`: a certificate it
accepts is an exact solution. -/
theorem check_sound (c : RidgeInstance) (h : c.check = true) :
    0 ≤ c.lam ∧ NormalEqMulti c.Xf c.Yf c.W0f c.lam c.Wf := by
  have h' : (((((shapeOk c.X c.m c.d && shapeOk c.Y c.m c.p) && shapeOk c.W0 c.d c.p) &&
      shapeOk c.W c.d c.p) && decide (0 ≤ c.lam)) &&
        allFin c.p (fun j => allFin c.d (fun i => c.entryOk j i))) = true := h
  simp only [Bool.and_eq_true, decide_eq_true_eq] at h'
  refine ⟨h'.1.2, ?_⟩
  intro j i
  have hj := allFin_spec h'.2 j
  have hi := allFin_spec hj i
  exact of_decide_eq_true hi

/-- **Certified optimality.** If `check c = true`, the certified `W` minimises the instance's
ridge objective over all `V`. Constrains `ridgefill.certify.export_lean_certificate` and
`ridgefill.ridge.solve_ridge`: an exported, checked certificate is a proof that the solve returned
the exact ridge minimiser for that instance. -/
theorem optimal_of_check (c : RidgeInstance) (h : c.check = true) (V : Fin c.d → Fin c.p → Rat) :
    c.obj c.Wf ≤ c.obj V :=
  ridge_multi_optimal c.Xf c.Yf c.W0f c.lam (c.check_sound h).1 (c.check_sound h).2 V

/-- **Certified uniqueness.** If `check c = true` and `λ > 0`, every solution of the instance's
normal equations is the certified `W`. Constrains `ridgefill.certify.check_certificate`. -/
theorem unique_of_check (c : RidgeInstance) (h : c.check = true) (hlam : 0 < c.lam)
    {V : Fin c.d → Fin c.p → Rat} (hV : NormalEqMulti c.Xf c.Yf c.W0f c.lam V) : V = c.Wf :=
  ridge_multi_unique c.Xf c.Yf c.W0f c.lam hlam hV (c.check_sound h).2

end RidgeInstance

/-- A committed example (`m = 8`, `d = 4`, `p = 1`, `λ = 1`, `W0` the first identity column):
rational data and the exact ridge solution. -/
@[expose] def exampleInstance : RidgeInstance where
  m := 8
  d := 4
  p := 1
  X := [[1/2, 3, -7, 2], [7/2, -8, 1, -7/2], [-7/4, -8, -2, 9/4], [-4, -4, 0, -5], [3, 4, -3, 2], [8, 9, -3/4, 2], [1/4, 9/4, 2/3, -1], [-2, 3, 7/4, 1/4]]
  Y := [[0], [-7], [7/2], [-2], [-5/2], [4], [-7/5], [9/2]]
  W0 := [[1], [0], [0], [0]]
  lam := 1
  W := [[-11465493130244/28733430152769], [9517772577248/47889050254615], [19098854757568/47889050254615], [148144691459746/143667150763845]]

/-- The committed example passes the checker (by kernel evaluation with `decide +kernel`).
Exercises `ridgefill.certify.check_certificate`. -/
theorem exampleInstance_check : exampleInstance.check = true := by decide +kernel

/-- The committed example's `W` is the exact ridge minimiser. Exercises
`ridgefill.certify.export_lean_certificate`. -/
theorem exampleInstance_optimal (V : Fin exampleInstance.d → Fin exampleInstance.p → Rat) :
    exampleInstance.obj exampleInstance.Wf ≤ exampleInstance.obj V :=
  exampleInstance.optimal_of_check exampleInstance_check V

/-- A wrong certificate (one entry of `W` perturbed by `1/1000`). -/
@[expose] def badInstance : RidgeInstance := { exampleInstance with W := [[-11465493130244/28733430152769], [9517772577248/47889050254615], [3829348761564523/9577810050923000], [148144691459746/143667150763845]] }

/-- The checker rejects the wrong certificate. Exercises `ridgefill.certify.check_certificate`. -/
theorem badInstance_rejected : badInstance.check = false := by decide +kernel

end KvaLean

end
