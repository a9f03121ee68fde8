module

public import KvaLean.Ridge
public import KvaLean.Causality

public section

namespace KvaLean

open Lean.Grind

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- Picking one term out of a sum with an indicator: `∑ᵢ [i = c] fᵢ = f_c` (or `0` if `c ≥ n`).
Substrate for `identity_fill_eq` (`ridgefill.fill.predict_inputs` with `W = I`). -/
theorem sum_ite_eq : ∀ {n : Nat} (f : Fin n → α) (c : Nat),
    (sum fun i : Fin n => if i.val = c then f i else 0) = if h : c < n then f ⟨c, h⟩ else 0
  | 0, f, c => by
    show (0 : α) = _
    rw [dif_neg (Nat.not_lt_zero c)]
  | n + 1, f, c => by
    rw [sum_succ]
    have ih := sum_ite_eq (fun i : Fin n => f i.castSucc) c
    have e : (sum fun i : Fin n => if (Fin.castSucc i).val = c then f i.castSucc else 0) =
        sum fun i : Fin n => if i.val = c then f i.castSucc else 0 := rfl
    have ih' : (sum fun i : Fin n => if i.val = c then f i.castSucc else 0) =
        if h : c < n then f (Fin.castSucc ⟨c, h⟩) else 0 := ih
    rw [e, ih']
    by_cases h1 : c < n
    · have h2 : c < n + 1 := by omega
      have h3 : ¬ (Fin.last n).val = c := by
        show ¬ n = c
        omega
      rw [dif_pos h1, dif_pos h2, if_neg h3]
      show f ⟨c, h2⟩ + 0 = f ⟨c, h2⟩
      grind
    · by_cases h4 : c = n
      · have h2 : c < n + 1 := by omega
        have h3 : (Fin.last n).val = c := h4.symm
        have h5 : (⟨c, h2⟩ : Fin (n + 1)) = Fin.last n := Fin.eq_of_val_eq h4
        rw [dif_neg h1, dif_pos h2, if_pos h3, h5]
        grind
      · have h2 : ¬ c < n + 1 := by omega
        have h3 : ¬ (Fin.last n).val = c := by
          show ¬ n = c
          omega
        rw [dif_neg h1, dif_neg h2, if_neg h3]
        grind

/-- The affine map with `W = I` and `b = 0` is the identity: `affineMap idMat 0 h = h`.
Constrains `ridgefill.fill.predict_inputs`: the `identity` mode predicts `x̂_l = h_S`. -/
theorem affineMap_idMat_zero {n : Nat} (h : Fin n → α) : affineMap idMat (fun _ => 0) h = h := by
  funext c
  show (sum fun i => h i * (if i.val = c.val then (1 : α) else 0)) + 0 = h c
  have e : (sum fun i => h i * (if i.val = c.val then (1 : α) else 0)) =
      sum fun i => if i.val = c.val then h i else 0 :=
    sum_congr fun i => by
      by_cases hi : i.val = c.val
      · rw [if_pos hi, if_pos hi]
        grind
      · rw [if_neg hi, if_neg hi]
        grind
  rw [e, sum_ite_eq, dif_pos c.isLt]
  show h c + 0 = h c
  grind

/-- **`identity_fill_eq`**: filling with the affine predictor `W_l = I`, `b_l = 0` is the
identity fill (`x̂_l = h_S` for every late layer): the filled model's layer inputs and cache
entries are those of the plan whose map is the identity. Constrains the `identity` mode of
`ridgefill.fill.prefill` and `ridgefill.fill.predict_inputs`. -/
theorem identity_fill_eq {Tok Cache : Type} {n : Nat} (D : Decoder Tok (Fin n → α) Cache)
    (tok : Nat → Tok) (S : Nat) (filled : Nat → Bool) (l t : Nat) :
    D.fillInput tok ⟨S, filled, fun _ => affineMap idMat (fun _ => 0)⟩ l t =
        D.fillInput tok ⟨S, filled, fun _ h => h⟩ l t ∧
      D.fillCache tok ⟨S, filled, fun _ => affineMap idMat (fun _ => 0)⟩ l t =
        D.fillCache tok ⟨S, filled, fun _ h => h⟩ l t := by
  have e : (fun (_ : Nat) => affineMap (idMat (α := α) (n := n)) (fun _ => 0)) =
      fun (_ : Nat) (h : Fin n → α) => h :=
    funext fun _ => funext fun h => affineMap_idMat_zero h
  have eP : (⟨S, filled, fun _ => affineMap idMat (fun _ => 0)⟩ : FillPlan (Fin n → α)) =
      ⟨S, filled, fun _ h => h⟩ :=
    congrArg (fun mp => (⟨S, filled, mp⟩ : FillPlan (Fin n → α))) e
  rw [eP]
  exact ⟨rfl, rfl⟩

section Rate

variable {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α)

/-- **`ridge_identity_rate`**: for `λ ≥ 0` and any solution `w_λ` of the normal equations with
prior `w₀` (in RidgeFill `w₀` is a column of the identity, the identity fill),
`λ² ‖w_λ − w₀‖² ≤ ‖Xᵀ(y − X w₀)‖²`: the fitted map moves away from the identity by at most
`‖Xᵀ(y − Xw₀)‖ / λ`. Constrains `ridgefill.ridge.solve_ridge` (identity-centred ridge). -/
theorem ridge_identity_rate (lam : α) (hlam : 0 ≤ lam) {w : Fin d → α}
    (hN : NormalEq X y w0 lam w) :
    lam * lam * normSq (fun i => w i - w0 i) ≤ normSq (matTVec X (fun k => y k - matVec X w0 k)) := by
  have hA : ∀ i, matTVec X (matVec X (fun i => w i - w0 i)) i =
      matTVec X (matVec X w) i - matTVec X (matVec X w0) i := by
    intro i
    have e : matVec X (fun i => w i - w0 i) = fun k => matVec X w k - matVec X w0 k :=
      funext fun k => matVec_sub X w w0 k
    rw [e, matTVec_sub X (matVec X w) (matVec X w0) i]
  have hr : matTVec X (fun k => y k - matVec X w0 k) =
      fun i => matTVec X (matVec X (fun i => w i - w0 i)) i + lam * (w i - w0 i) :=
    funext fun i => by
      have h1 := hN i
      have h2 := hA i
      have h3 := matTVec_sub X y (matVec X w0) i
      grind
  rw [hr, normSq_add_smul (matTVec X (matVec X (fun i => w i - w0 i))) (fun i => w i - w0 i) lam]
  have h4 := dot_comm (matTVec X (matVec X (fun i => w i - w0 i))) (fun i => w i - w0 i)
  have h5 := dot_matVec X (fun i => w i - w0 i) (matVec X (fun i => w i - w0 i))
  have h6 : dot (matVec X (fun i => w i - w0 i)) (matVec X (fun i => w i - w0 i)) =
      normSq (matVec X (fun i => w i - w0 i)) := rfl
  have h7 := normSq_nonneg (matTVec X (matVec X (fun i => w i - w0 i)))
  have h8 := OrderedRing.mul_nonneg hlam (normSq_nonneg (matVec X (fun i => w i - w0 i)))
  grind

/-- **`ridge_tendsto_identity`**: as `λ → ∞` the ridge map tends to the identity prior: for every
`ε > 0` there is `Λ > 0` such that every solution `w_λ` of the normal equations with `λ ≥ Λ`
satisfies `‖w_λ − w₀‖² ≤ ε`. Constrains `ridgefill.ridge.solve_ridge`: a large `λ` recovers the
identity fill. -/
theorem ridge_tendsto_identity {ε : α} (hε : 0 < ε) :
    ∃ Λ : α, 0 < Λ ∧ ∀ lam : α, Λ ≤ lam → ∀ w : Fin d → α, NormalEq X y w0 lam w →
      normSq (fun i => w i - w0 i) ≤ ε := by
  obtain ⟨R, hR⟩ : ∃ R, R = normSq (matTVec X (fun k => y k - matVec X w0 k)) := ⟨_, rfl⟩
  have hR0 : 0 ≤ R := by
    rw [hR]
    exact normSq_nonneg _
  have hRe : 0 ≤ R / ε := by
    apply Classical.byContradiction
    intro hneg
    have h1 : R / ε < 0 := by grind
    have h2 := OrderedRing.mul_neg_of_neg_of_pos h1 hε
    have h3 : R / ε * ε = R := by grind
    grind
  have hΛ : (R / ε + 1) * ε = R + ε := by grind
  refine ⟨R / ε + 1, by grind, ?_⟩
  intro lam hlam w hN
  have hlam0 : 0 ≤ lam := by grind
  have hrate := ridge_identity_rate X y w0 lam hlam0 hN
  rw [← hR] at hrate
  apply Classical.byContradiction
  intro hgt
  have hs : ε ≤ normSq (fun i => w i - w0 i) := by grind
  have a1 := OrderedRing.mul_le_mul_of_nonneg_left hs (OrderedRing.mul_nonneg hlam0 hlam0)
  have a2 := OrderedRing.mul_nonneg (by grind : (0 : α) ≤ lam - 1)
    (OrderedRing.mul_nonneg hlam0 (Std.le_of_lt hε))
  have a3 := OrderedRing.mul_le_mul_of_nonneg_right hlam (Std.le_of_lt hε)
  grind

/-- **`ridge_eq_prior_of_exact`**: if the prior already fits the data exactly (`y = X w₀`, e.g. a
layer whose input equals `h_S`) then for `λ > 0` the ridge solution is the prior itself,
`w_λ = w₀`. Constrains `ridgefill.ridge.solve_ridge`. -/
theorem ridge_eq_prior_of_exact (lam : α) (hlam : 0 < lam) (hy : ∀ k, y k = matVec X w0 k)
    {w : Fin d → α} (hN : NormalEq X y w0 lam w) : w = w0 := by
  have h0 : NormalEq X y w0 lam w0 := by
    intro i
    have e : y = matVec X w0 := funext hy
    rw [e]
  exact ridge_unique X y w0 lam hlam hN h0

end Rate

end KvaLean

end
