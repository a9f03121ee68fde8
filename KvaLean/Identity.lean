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
entries are those of the plan whose map is the identity (both plain row maps,
`FillPlan.ofRowMap`). Constrains the `identity` mode of `ridgefill.fill.prefill` and
`ridgefill.fill.predict_inputs`. -/
theorem identity_fill_eq {Tok Cache : Type} {n : Nat} (D : Decoder Tok (Fin n → α) Cache)
    (tok : Nat → Tok) (S : Nat) (filled : Nat → Bool) (l t : Nat) :
    D.fillInput tok (FillPlan.ofRowMap S filled fun _ => affineMap idMat (fun _ => 0)) l t =
        D.fillInput tok (FillPlan.ofRowMap S filled fun _ h => h) l t ∧
      D.fillCache tok (FillPlan.ofRowMap S filled fun _ => affineMap idMat (fun _ => 0)) l t =
        D.fillCache tok (FillPlan.ofRowMap S filled fun _ h => h) l t := by
  have e : (fun (_ : Nat) => affineMap (idMat (α := α) (n := n)) (fun _ => 0)) =
      fun (_ : Nat) (h : Fin n → α) => h :=
    funext fun _ => funext fun h => affineMap_idMat_zero h
  have eP : (FillPlan.ofRowMap S filled fun _ => affineMap idMat (fun _ => 0) : FillPlan (Fin n → α)) =
      FillPlan.ofRowMap S filled fun _ h => h :=
    congrArg (FillPlan.ofRowMap S filled) e
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
satisfies `‖w_λ − w₀‖² ≤ ε`. Constrains `ridgefill.ridge.solve_ridge`: a large `λ` pulls the
map `W` to its prior `I`. It says nothing about the intercept: with the unpenalised intercept of
`ridgefill.ridge.fit_maps` the whole predictor tends to `W = I`, `b = x̄ − h̄`
(`fit_maps_tendsto_centred`), which is the identity fill only when `x̄ = h̄`
(`centred_limit_eq_identity_iff`). -/
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

section Limit

/-- `‖u − c v‖² ≥ 0` at the best `c`, i.e. the Cauchy–Schwarz inequality
`⟨u, v⟩² ≤ ‖u‖² ‖v‖²`. Substrate for `intercept_err_le` (`ridgefill.ridge.fit_maps`). -/
theorem dot_mul_self_le {n : Nat} (u v : Fin n → α) :
    dot u v * dot u v ≤ normSq u * normSq v := by
  rcases Classical.em (normSq u = 0) with hN | hN
  · have hz := (normSq_eq_zero_iff u).mp hN
    have h0 : dot u v = 0 := dot_zero_left hz v
    rw [h0, hN]
    grind
  · have hN0 := normSq_nonneg u
    have hpos : 0 < normSq u := by grind
    obtain ⟨t, ht⟩ : ∃ t, t = dot u v / normSq u := ⟨_, rfl⟩
    have htN : t * normSq u = dot u v := by
      rw [ht]
      grind
    have hexp := normSq_add_smul v u (-t)
    have hnn := normSq_nonneg (fun i => v i + -t * u i)
    have hc := dot_comm v u
    have e1 : -t * -t * normSq u = t * dot u v := by
      rw [← htN]
      grind
    have h1 : 0 ≤ normSq v - t * dot u v := by grind
    have h2 := OrderedRing.mul_nonneg (Std.le_of_lt hpos) h1
    have e2 : normSq u * (t * dot u v) = dot u v * dot u v := by
      rw [← htN]
      grind
    grind

/-- `⟨u, a − b⟩ = ⟨u, a⟩ − ⟨u, b⟩`. Substrate for `intercept_err_le` (`ridgefill.ridge.fit_maps`). -/
theorem dot_sub_right {n : Nat} (u a b : Fin n → α) :
    dot u (fun i => a i - b i) = dot u a - dot u b :=
  matVec_sub (fun _ : Fin 1 => u) a b ⟨0, Nat.zero_lt_one⟩

/-- `⟨u, I_c⟩ = u_c`: the dot product with a column of the identity picks one coordinate.
Substrate for `intercept_err_le` (`ridgefill.ridge.fit_maps`). -/
theorem dot_col_idMat {n : Nat} (u : Fin n → α) (c : Fin n) : dot u (col idMat c) = u c := by
  have h := congrFun (affineMap_idMat_zero u) c
  have e : affineMap idMat (fun _ => (0 : α)) u c = dot u (col idMat c) + 0 := rfl
  rw [e] at h
  grind

/-- `h I + b = h + b`: the affine predictor with `W = I`. Constrains `ridgefill.fill.prefill`
(mode `centred`, `W = I`, `b = x̄ − h̄`). -/
theorem affineMap_idMat {n : Nat} (b h : Fin n → α) : affineMap idMat b h = fun c => h c + b c := by
  funext c
  show affineMap idMat b h c = h c + b c
  have e := congrFun (affineMap_idMat_zero h) c
  have e1 : affineMap idMat (fun _ => (0 : α)) h c = dot h (col idMat c) + 0 := rfl
  have e2 : affineMap idMat b h c = dot h (col idMat c) + b c := rfl
  rw [e2]
  rw [e1] at e
  grind

/-- `0 < a / b` for `0 < a`, `0 < b`. Substrate for `fit_maps_tendsto_centred`. -/
theorem div_pos_of_pos {a b : α} (ha : 0 < a) (hb : 0 < b) : 0 < a / b := by
  apply Classical.byContradiction
  intro hneg
  have h1 : a / b ≤ 0 := by grind
  have h2 := OrderedRing.mul_le_mul_of_nonneg_right h1 (Std.le_of_lt hb)
  have h3 : a / b * b = a := by grind
  grind

/-- The `ε`–`Λ` step shared by the limits: if `0 ≤ R`, `λ ≥ R/ε + 1` and `λ² q ≤ R` then `q ≤ ε`.
Substrate for `ridge_multi_tendsto` (`ridgefill.ridge.solve_ridge`). -/
theorem le_of_mul_self_mul_le {R q ε lam : α} (hε : 0 < ε) (hR : 0 ≤ R) (hlam : R / ε + 1 ≤ lam)
    (h : lam * lam * q ≤ R) : q ≤ ε := by
  have hRe : 0 ≤ R / ε := by
    apply Classical.byContradiction
    intro hneg
    have h1 : R / ε < 0 := by grind
    have h2 := OrderedRing.mul_neg_of_neg_of_pos h1 hε
    have h3 : R / ε * ε = R := by grind
    grind
  have hΛ : (R / ε + 1) * ε = R + ε := by grind
  have hlam0 : 0 ≤ lam := by grind
  apply Classical.byContradiction
  intro hgt
  have hs : ε ≤ q := by grind
  have a1 := OrderedRing.mul_le_mul_of_nonneg_left hs (OrderedRing.mul_nonneg hlam0 hlam0)
  have a2 := OrderedRing.mul_nonneg (by grind : (0 : α) ≤ lam - 1)
    (OrderedRing.mul_nonneg hlam0 (Std.le_of_lt hε))
  have a3 := OrderedRing.mul_le_mul_of_nonneg_right hlam (Std.le_of_lt hε)
  grind

/-- **`ridge_multi_identity_rate`**: for `λ ≥ 0` and any solution `W_λ` of the multi-output normal
equations with prior `W₀`, `λ² ‖W_λ − W₀‖²_F ≤ ∑_c ‖Xᵀ(Y_c − X W₀_c)‖²`. Constrains
`ridgefill.ridge.solve_ridge` (all output columns of one layer's map). -/
theorem ridge_multi_identity_rate {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) (lam : α) (hlam : 0 ≤ lam) {W : Fin d → Fin p → α}
    (hN : NormalEqMulti X Y W0 lam W) :
    lam * lam * frobSq (fun i c => W i c - W0 i c) ≤
      sum fun c => normSq (matTVec X (fun k => Y k c - matVec X (col W0 c) k)) := by
  have h1 : frobSq (fun i c => W i c - W0 i c) =
      sum fun c => normSq (fun i => col W c i - col W0 c i) :=
    sum_comm (fun i c => (W i c - W0 i c) * (W i c - W0 i c))
  rw [h1, mul_sum]
  exact sum_le_sum fun c => ridge_identity_rate X (col Y c) (col W0 c) lam hlam (hN c)

/-- **`ridge_multi_tendsto`**: as `λ → ∞` every solution of the multi-output normal equations
tends to the prior in Frobenius norm: for every `ε > 0` there is `Λ > 0` with
`‖W_λ − W₀‖²_F ≤ ε` for all `λ ≥ Λ`. Constrains `ridgefill.ridge.solve_ridge`. -/
theorem ridge_multi_tendsto {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) {ε : α} (hε : 0 < ε) :
    ∃ Λ : α, 0 < Λ ∧ ∀ lam : α, Λ ≤ lam → ∀ W : Fin d → Fin p → α, NormalEqMulti X Y W0 lam W →
      frobSq (fun i c => W i c - W0 i c) ≤ ε := by
  obtain ⟨R, hR⟩ : ∃ R, R = sum fun c => normSq (matTVec X (fun k => Y k c - matVec X (col W0 c) k)) :=
    ⟨_, rfl⟩
  have hR0 : 0 ≤ R := by
    rw [hR]
    exact sum_nonneg fun c => normSq_nonneg _
  have hRe : 0 ≤ R / ε := by
    have e2 : R / ε * ε = R := by grind
    apply Classical.byContradiction
    intro hneg
    have h1 : R / ε < 0 := by grind
    have h2 := OrderedRing.mul_neg_of_neg_of_pos h1 hε
    grind
  refine ⟨R / ε + 1, by grind, fun lam hlam W hN => ?_⟩
  have hrate := ridge_multi_identity_rate X Y W0 lam (by grind) hN
  rw [← hR] at hrate
  exact le_of_mul_self_mul_le hε hR0 hlam hrate

/-- The intercept error of a fitted map with prior `I`: `‖b − (ȳ − x̄)‖² ≤ ‖x̄‖² ‖W − I‖²_F`, where
`b = ȳ − x̄ W` (`interceptMulti`), since `b − (ȳ − x̄) = −x̄ (W − I)`. Constrains
`ridgefill.ridge.fit_maps`. -/
theorem intercept_err_le {m d : Nat} (X Y : Fin m → Fin d → α) (W : Fin d → Fin d → α) :
    normSq (fun c => interceptMulti X Y W c - (colMean Y c - colMean X c)) ≤
      normSq (colMean X) * frobSq (fun i c => W i c - idMat i c) := by
  have e : ∀ c, interceptMulti X Y W c - (colMean Y c - colMean X c) =
      -(dot (colMean X) (fun i => W i c - idMat i c)) := by
    intro c
    have h2 := dot_col_idMat (colMean X) c
    have h3 : interceptMulti X Y W c = colMean Y c - dot (colMean X) (col W c) := rfl
    have h4 : dot (colMean X) (fun i => W i c - idMat i c) =
        dot (colMean X) (col W c) - dot (colMean X) (col idMat c) :=
      dot_sub_right (colMean X) (col W c) (col idMat c)
    grind
  have h5 : normSq (fun c => interceptMulti X Y W c - (colMean Y c - colMean X c)) =
      sum fun c => dot (colMean X) (fun i => W i c - idMat i c) *
        dot (colMean X) (fun i => W i c - idMat i c) :=
    sum_congr fun c => (by rw [e c]; grind :
      (interceptMulti X Y W c - (colMean Y c - colMean X c)) *
        (interceptMulti X Y W c - (colMean Y c - colMean X c)) =
      dot (colMean X) (fun i => W i c - idMat i c) * dot (colMean X) (fun i => W i c - idMat i c))
  have h6 : frobSq (fun i c => W i c - idMat i c) =
      sum fun c => normSq (fun i => W i c - idMat i c) :=
    sum_comm (fun i c => (W i c - idMat i c) * (W i c - idMat i c))
  rw [h5, h6, mul_sum]
  exact sum_le_sum fun c => dot_mul_self_le (colMean X) (fun i => W i c - idMat i c)

/-- **`fit_maps_tendsto_centred`**: the whole fitted predictor with the unpenalised intercept tends
to `W = I`, `b = x̄ − h̄` as `λ → ∞`. With inputs `X` (rows `h_S`, mean `h̄ = colMean X`) and targets
`Y` (rows `x_l`, mean `x̄ = colMean Y`), for every `ε > 0` there is `Λ > 0` such that every `W`
solving the centred normal equations with prior `I` at `λ ≥ Λ`, and its intercept
`b = x̄ − h̄ W` (`interceptMulti`), satisfy `‖W − I‖²_F ≤ ε` and `‖b − (x̄ − h̄)‖² ≤ ε`.
Constrains `ridgefill.ridge.fit_maps`; the limit is the `centred` mode of `ridgefill.fill.prefill`
(`W = I`, `b = x̄ − h̄`), not the identity fill unless `x̄ = h̄` (`centred_limit_eq_identity_iff`). -/
theorem fit_maps_tendsto_centred {m d : Nat} (X Y : Fin m → Fin d → α) {ε : α} (hε : 0 < ε) :
    ∃ Λ : α, 0 < Λ ∧ ∀ lam : α, Λ ≤ lam → ∀ W : Fin d → Fin d → α,
      NormalEqMulti (centre X) (centre Y) idMat lam W →
        frobSq (fun i c => W i c - idMat i c) ≤ ε ∧
          normSq (fun c => interceptMulti X Y W c - (colMean Y c - colMean X c)) ≤ ε := by
  have hN0 := normSq_nonneg (colMean X)
  have hK : 0 < normSq (colMean X) + 1 := by grind
  have he' := div_pos_of_pos hε hK
  have hee : ε / (normSq (colMean X) + 1) * (normSq (colMean X) + 1) = ε := by grind
  obtain ⟨Λ, hΛ, hall⟩ := ridge_multi_tendsto (centre X) (centre Y) idMat he'
  refine ⟨Λ, hΛ, fun lam hlam W hN => ?_⟩
  have hF := hall lam hlam W hN
  have hb := intercept_err_le X Y W
  have h1 := OrderedRing.mul_le_mul_of_nonneg_left hF hN0
  have h2 := OrderedRing.mul_nonneg hN0 (Std.le_of_lt he')
  constructor
  · grind
  · grind

/-- **`centred_limit_eq_identity_iff`**: the large-`λ` limit `W = I`, `b = x̄ − h̄` is the identity
fill (`x̂ = h` for every `h`) exactly when `x̄ = h̄`. Constrains the `centred` and `identity` modes of
`ridgefill.fill.prefill`. -/
theorem centred_limit_eq_identity_iff {d : Nat} (xbar hbar : Fin d → α) :
    (affineMap idMat (fun c => xbar c - hbar c) = fun h => h) ↔ xbar = hbar := by
  constructor
  · intro H
    funext c
    have h1 : affineMap idMat (fun c => xbar c - hbar c) (fun _ => (0 : α)) c = 0 :=
      congrFun (congrFun H (fun _ => 0)) c
    have h2 : affineMap idMat (fun c => xbar c - hbar c) (fun _ => (0 : α)) c = 0 + (xbar c - hbar c) :=
      congrFun (affineMap_idMat _ _) c
    grind
  · intro H
    rw [H]
    funext h c
    show affineMap idMat (fun c => hbar c - hbar c) h c = h c
    have h2 : affineMap idMat (fun c => hbar c - hbar c) h c = h c + (hbar c - hbar c) :=
      congrFun (affineMap_idMat _ _) c
    rw [h2]
    grind

end Limit

section Residual

/-- The error of an approximate solution from its residual: if `⟨u, (XᵀX + λI) u⟩ ≥ μ‖u‖²` for
all `u` (`μ > 0`) and `g = (XᵀX + λI) e`, then `μ² ‖e‖² ≤ ‖g‖²`. Substrate for
`ridge_err_le_residual` (`ridgefill.certify.layer_certificate`). -/
theorem err_le_of_coercive {m d : Nat} {μ lam : α} (hμ : 0 < μ) (X : Fin m → Fin d → α)
    (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ normSq (matVec X u) + lam * normSq u)
    (e g : Fin d → α) (hg : ∀ i, g i = matTVec X (matVec X e) i + lam * e i) :
    μ * μ * normSq e ≤ normSq g := by
  have hgf : g = fun i => matTVec X (matVec X e) i + lam * e i := funext hg
  have h1 := dot_add_smul_left (matTVec X (matVec X e)) e e lam
  rw [← hgf] at h1
  have h2 := dot_comm (matTVec X (matVec X e)) e
  have h3 := dot_matVec X e (matVec X e)
  have h5 : normSq (matVec X e) = dot (matVec X e) (matVec X e) := rfl
  have h6 : normSq e = dot e e := rfl
  have hc := hcoer e
  have hcs := dot_mul_self_le e g
  have h7 := dot_comm g e
  have hN0 := normSq_nonneg e
  have hD : μ * normSq e ≤ dot e g := by grind
  rcases Classical.em (normSq e = 0) with hz | hz
  · rw [hz]
    have := normSq_nonneg g
    grind
  · have hpos : 0 < normSq e := by grind
    have hμN : 0 ≤ μ * normSq e := OrderedRing.mul_nonneg (Std.le_of_lt hμ) hN0
    have a1 := OrderedRing.mul_le_mul_of_nonneg_left hD hμN
    have hD0 : 0 ≤ dot e g := by grind
    have a2 := OrderedRing.mul_le_mul_of_nonneg_right hD hD0
    apply Classical.byContradiction
    intro hneg
    have ht : normSq g - μ * μ * normSq e < 0 := by grind
    have hm := OrderedRing.mul_neg_of_neg_of_pos ht hpos
    grind

/-- **`ridge_err_le_residual`** (the bound behind `ridgefill certify`): if `G + λI ⪰ μI` with
`μ > 0` (stated as `‖X u‖² + λ‖u‖² ≥ μ‖u‖²` for all `u`) and `w★` solves the normal equations,
then any `w` is within `‖R‖/μ` of `w★`, `μ² ‖w − w★‖² ≤ ‖R‖²`, where
`R = Xᵀ(Xw − y) + λ(w − w₀) = (G + λI) w − (B + λw₀)` is the residual of `w` in the normal
equations (`ridgeGrad`). Constrains `ridgefill.certify.layer_certificate` (its
`weight_error_bound`, `‖R‖_F / μ` per output column summed in Frobenius norm). -/
theorem ridge_err_le_residual {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) (lam : α) {μ : α} (hμ : 0 < μ)
    (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ normSq (matVec X u) + lam * normSq u)
    {wstar : Fin d → α} (hN : NormalEq X y w0 lam wstar) (w : Fin d → α) :
    μ * μ * normSq (fun i => w i - wstar i) ≤ normSq (ridgeGrad X y w0 lam w) := by
  have hg : ∀ i, ridgeGrad X y w0 lam w i =
      matTVec X (matVec X (fun i => w i - wstar i)) i + lam * (w i - wstar i) := by
    intro i
    have h0 := ridgeGrad_eq_zero X y w0 lam hN i
    have e1 : ridgeGrad X y w0 lam w i =
        matTVec X (fun k => matVec X w k - y k) i + lam * (w i - w0 i) := rfl
    have e2 : ridgeGrad X y w0 lam wstar i =
        matTVec X (fun k => matVec X wstar k - y k) i + lam * (wstar i - w0 i) := rfl
    have e3 : matVec X (fun i => w i - wstar i) = fun k => matVec X w k - matVec X wstar k :=
      funext fun k => matVec_sub X w wstar k
    have e5 : (fun k => (matVec X w k - y k) - (matVec X wstar k - y k)) =
        fun k => matVec X w k - matVec X wstar k := funext fun k => by grind
    have e4 : matTVec X (fun k => matVec X w k - matVec X wstar k) i =
        matTVec X (fun k => matVec X w k - y k) i - matTVec X (fun k => matVec X wstar k - y k) i := by
      rw [← e5]
      exact matTVec_sub X (fun k => matVec X w k - y k) (fun k => matVec X wstar k - y k) i
    rw [e3]
    grind
  exact err_le_of_coercive hμ X hcoer _ _ hg

end Residual

end KvaLean

end
