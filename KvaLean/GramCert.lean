module

public import KvaLean.Solve

public section

namespace KvaLean

open Lean.Grind

/-! ### The reasoning of `ridgefill certify --rigorous`, in the Gram form it computes

The certificate works from the statistics, not from data rows: with the float64 centred Gram `G`
(`d × d`, not exactly symmetric), cross term `B` and `s = Σ‖x − x̄‖²`, the objective of one layer is
`J(W) = Σ_c (⟨W_c, G W_c⟩ − 2⟨W_c, B_c⟩) + s + λ‖W − W₀‖²_F` (`gramObj`), which reads only the symmetric
part of `G`: `A = ½(G + Gᵀ) + λI` (`symAddDiag`). With `μ ≤ λ_min(A)` as a hypothesis
(`μ‖u‖² ≤ ⟨u, A u⟩`, what the Cholesky bound certifies) and `W★` solving `A W★ = B + λW₀`:
the error from the residual (`gram_err_le_residual`), the objective gap as `‖W − W★‖²_A` (`gram_gap`),
the gap through a helper point (`gram_gap_le`), and the bias (`bias_err_le`), all column by column over
any linearly ordered field. -/

section Defs

variable {α : Type} [Field α]

/-- `A = ½(G + Gᵀ) + λI`: the symmetric part of `G` plus `λI`. -/
@[expose] noncomputable def symAddDiag {d : Nat} (G : Fin d → Fin d → α) (lam : α) : Fin d → Fin d → α :=
  fun i j => (G i j + G j i) / 2 + lam * idMat i j

/-- One output column of the Gram-form objective: `⟨w, G w⟩ − 2⟨w, b⟩ + λ‖w − w₀‖²`. -/
@[expose] noncomputable def gramColObj {d : Nat} (G : Fin d → Fin d → α) (b : Fin d → α) (lam : α)
    (w0 w : Fin d → α) : α :=
  dot w (matVec G w) - 2 * dot w b + lam * normSq (fun i => w i - w0 i)

/-- The Gram-form ridge objective of one layer, `J(W) = Σ_c (⟨W_c, G W_c⟩ − 2⟨W_c, B_c⟩) + s +
λ‖W − W₀‖²_F` (`s = Σ‖x − x̄‖²`): the objective of `ridgefill.certify.rigorous_certificate`. -/
@[expose] noncomputable def gramObj {d p : Nat} (G : Fin d → Fin d → α) (B W0 : Fin d → Fin p → α)
    (s lam : α) (W : Fin d → Fin p → α) : α :=
  (sum fun c => dot (col W c) (matVec G (col W c)) - 2 * dot (col W c) (col B c)) + s +
    lam * frobSq (fun i c => W i c - W0 i c)

/-- The normal-equation residual `R = A W − (B + λW₀)`. -/
@[expose] noncomputable def gramResidual {d p : Nat} (A : Fin d → Fin d → α) (B W0 : Fin d → Fin p → α)
    (lam : α) (W : Fin d → Fin p → α) : Fin d → Fin p → α :=
  fun i c => matVec A (col W c) i - (B i c + lam * W0 i c)

/-- `‖E‖²_A = Σ_c ⟨E_c, A E_c⟩`. -/
@[expose] noncomputable def aNormSq {d p : Nat} (A : Fin d → Fin d → α) (E : Fin d → Fin p → α) : α :=
  sum fun c => dot (col E c) (matVec A (col E c))

/-- The bilinear form of `‖·‖²_A` on matrices: `⟨X, Y⟩_A = Σ_c ⟨X_c, A Y_c⟩` (`aNormSq A E = ⟨E, E⟩_A`). -/
@[expose] noncomputable def aForm {d p : Nat} (A : Fin d → Fin d → α) (X Y : Fin d → Fin p → α) : α :=
  sum fun c => dot (col X c) (matVec A (col Y c))

end Defs

section Theorems

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- `‖E‖²_F` column by column. Supporting lemma of `gram_err_le_residual`
(`ridgefill.certify.rigorous_certificate`). -/
theorem frobSq_eq_cols {d p : Nat} (E : Fin d → Fin p → α) :
    frobSq E = sum fun c => normSq (col E c) :=
  sum_comm (fun i c => E i c * E i c)

/-- `⟨a − b, x⟩ = ⟨a, x⟩ − ⟨b, x⟩`. Supporting lemma of `gram_gap`
(`ridgefill.certify.rigorous_certificate`). -/
theorem dot_sub_left {n : Nat} (a b x : Fin n → α) :
    dot (fun i => a i - b i) x = dot a x - dot b x := by
  rw [dot_comm, dot_sub_right, dot_comm x a, dot_comm x b]

/-- `‖w − w₀‖² = ‖w‖² − 2⟨w, w₀⟩ + ‖w₀‖²`. Supporting lemma of `gram_gap`
(`ridgefill.certify.rigorous_certificate`). -/
theorem normSq_sub {n : Nat} (w w0 : Fin n → α) :
    normSq (fun i => w i - w0 i) = normSq w - 2 * dot w w0 + normSq w0 := by
  have e : (fun i => w i - w0 i) = fun i => w i + -1 * w0 i := funext fun i => by grind
  rw [e, normSq_add_smul]
  grind

/-- `A = ½(G + Gᵀ) + λI` is symmetric. Supporting lemma of `gram_gap`
(`ridgefill.certify.rigorous_certificate`). -/
theorem symAddDiag_symm {d : Nat} (G : Fin d → Fin d → α) (lam : α) (i j : Fin d) :
    symAddDiag G lam i j = symAddDiag G lam j i := by
  have e : (idMat i j : α) = idMat j i := by
    show (if i.val = j.val then (1 : α) else 0) = if j.val = i.val then 1 else 0
    by_cases h : i.val = j.val
    · rw [if_pos h, if_pos h.symm]
    · rw [if_neg h, if_neg (fun e => h e.symm)]
  show (G i j + G j i) / 2 + lam * idMat i j = (G j i + G i j) / 2 + lam * idMat j i
  rw [e]
  grind

/-- `⟨u, Gᵀ u⟩ = ⟨u, G u⟩`. Supporting lemma of `gram_gap` (`ridgefill.certify.rigorous_certificate`). -/
theorem quad_transpose {d : Nat} (G : Fin d → Fin d → α) (u : Fin d → α) :
    dot u (matVec (fun i j => G j i) u) = dot u (matVec G u) := by
  have e : matVec (fun i j => G j i) u = matTVec G u := rfl
  rw [e, ← dot_matVec, dot_comm]

/-- `⟨u, A v⟩ = ⟨v, A u⟩` for a symmetric `A`. Supporting lemma of `gram_gap`
(`ridgefill.certify.rigorous_certificate`). -/
theorem dot_matVec_symm {d : Nat} (A : Fin d → Fin d → α) (hA : ∀ i j, A i j = A j i)
    (u v : Fin d → α) : dot u (matVec A v) = dot v (matVec A u) := by
  have e : matTVec A u = matVec A u := funext fun i => sum_congr fun k => by rw [hA k i]
  rw [dot_comm, dot_matVec, e]

/-- `A u = ½ G u + ½ Gᵀ u + λ u`. Supporting lemma of `gram_gap`
(`ridgefill.certify.rigorous_certificate`). -/
theorem matVec_symAddDiag {d : Nat} (G : Fin d → Fin d → α) (lam : α) (u : Fin d → α) (i : Fin d) :
    matVec (symAddDiag G lam) u i =
      1 / 2 * matVec G u i + 1 / 2 * matVec (fun a b => G b a) u i + lam * u i := by
  have h := sum_eq_lin3 (F := fun j => symAddDiag G lam i j * u j) (1 / 2) (1 / 2) lam
    (fun j => G i j * u j) (fun j => G j i * u j) (fun j => idMat i j * u j) (fun j => by
      show ((G i j + G j i) / 2 + lam * idMat i j) * u j = _
      grind)
  have e : (sum fun j => idMat i j * u j) = u i := matVec_idMat u i
  have e0 : matVec (symAddDiag G lam) u i = sum fun j => symAddDiag G lam i j * u j := rfl
  rw [e0, h, e]
  rfl

/-- `⟨u, A u⟩ = ⟨u, G u⟩ + λ‖u‖²`: the objective reads only the symmetric part of `G`. Supporting
lemma of `gram_gap` (`ridgefill.certify.rigorous_certificate`). -/
theorem quad_symAddDiag {d : Nat} (G : Fin d → Fin d → α) (lam : α) (u : Fin d → α) :
    dot u (matVec (symAddDiag G lam) u) = dot u (matVec G u) + lam * normSq u := by
  have hA : matVec (symAddDiag G lam) u = fun i =>
      1 / 2 * matVec G u i + 1 / 2 * matVec (fun a b => G b a) u i + lam * u i :=
    funext (matVec_symAddDiag G lam u)
  have h : dot u (fun i => 1 / 2 * matVec G u i + 1 / 2 * matVec (fun a b => G b a) u i + lam * u i) =
      1 / 2 * dot u (matVec G u) + 1 / 2 * dot u (matVec (fun a b => G b a) u) + lam * normSq u :=
    sum_eq_lin3 (1 / 2) (1 / 2) lam (fun i => u i * matVec G u i)
      (fun i => u i * matVec (fun a b => G b a) u i) (fun i => u i * u i) (fun i => by grind)
  have ht := quad_transpose G u
  rw [hA, h, ht]
  grind

/-- The error of a point from the residual, for any `A` with `μ‖u‖² ≤ ⟨u, A u⟩` (`μ > 0`): if
`r = A e` then `μ²‖e‖² ≤ ‖r‖²`. Supporting lemma of `gram_err_le_residual`
(`ridgefill.certify.rigorous_certificate`). -/
theorem err_le_of_coercive_mat {d : Nat} {μ : α} (hμ : 0 < μ) (A : Fin d → Fin d → α)
    (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ dot u (matVec A u))
    (e r : Fin d → α) (hr : ∀ i, r i = matVec A e i) :
    μ * μ * normSq e ≤ normSq r := by
  have hrf : r = matVec A e := funext hr
  have hD : μ * normSq e ≤ dot e r := by
    rw [hrf]
    exact hcoer e
  have hcs := dot_mul_self_le e r
  have hN0 := normSq_nonneg e
  rcases Classical.em (normSq e = 0) with hz | hz
  · rw [hz]
    have := normSq_nonneg r
    grind
  · have hpos : 0 < normSq e := by grind
    have hμN : 0 ≤ μ * normSq e := OrderedRing.mul_nonneg (Std.le_of_lt hμ) hN0
    have a1 := OrderedRing.mul_le_mul_of_nonneg_left hD hμN
    have hD0 : 0 ≤ dot e r := by grind
    have a2 := OrderedRing.mul_le_mul_of_nonneg_right hD hD0
    apply Classical.byContradiction
    intro hneg
    have ht : normSq r - μ * μ * normSq e < 0 := by grind
    have hm := OrderedRing.mul_neg_of_neg_of_pos ht hpos
    grind

/-- **`gram_err_le_residual`** (the weight bound of `ridgefill certify --rigorous`): for
`A = ½(G + Gᵀ) + λI` with `μ‖u‖² ≤ ⟨u, A u⟩` for all `u` (`0 < μ ≤ λ_min(A)`) and `W★` solving
`A W★ = B + λW₀`, every `W` has `μ²‖W − W★‖²_F ≤ ‖R‖²_F` with `R = A W − (B + λW₀)`, i.e.
`‖W − W★‖_F ≤ ‖R‖_F / μ`, all output columns at once. Constrains
`ridgefill.certify.rigorous_certificate` (`weight_error_bound`). -/
theorem gram_err_le_residual {d p : Nat} (G : Fin d → Fin d → α) (B W0 : Fin d → Fin p → α) (lam : α)
    {μ : α} (hμ : 0 < μ) (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ dot u (matVec (symAddDiag G lam) u))
    {Wstar : Fin d → Fin p → α}
    (hN : ∀ i c, matVec (symAddDiag G lam) (col Wstar c) i = B i c + lam * W0 i c)
    (W : Fin d → Fin p → α) :
    μ * μ * frobSq (fun i c => W i c - Wstar i c) ≤ frobSq (gramResidual (symAddDiag G lam) B W0 lam W) := by
  rw [frobSq_eq_cols, frobSq_eq_cols, mul_sum]
  refine sum_le_sum fun c => err_le_of_coercive_mat hμ (symAddDiag G lam) hcoer _ _ fun i => ?_
  show matVec (symAddDiag G lam) (col W c) i - (B i c + lam * W0 i c) =
    matVec (symAddDiag G lam) (fun i => col W c i - col Wstar c i) i
  rw [matVec_sub (symAddDiag G lam) (col W c) (col Wstar c) i, hN i c]

/-- The objective as a sum of column objectives. Supporting lemma of `gram_gap`
(`ridgefill.certify.rigorous_certificate`). -/
theorem gramObj_eq_sum {d p : Nat} (G : Fin d → Fin d → α) (B W0 : Fin d → Fin p → α) (s lam : α)
    (W : Fin d → Fin p → α) :
    gramObj G B W0 s lam W = (sum fun c => gramColObj G (col B c) lam (col W0 c) (col W c)) + s := by
  have h1 : frobSq (fun i c => W i c - W0 i c) = sum fun c => normSq (fun i => W i c - W0 i c) :=
    sum_comm (fun i c => (W i c - W0 i c) * (W i c - W0 i c))
  have h2 := sum_add (fun c => dot (col W c) (matVec G (col W c)) - 2 * dot (col W c) (col B c))
    (fun c => lam * normSq (fun i => W i c - W0 i c))
  have h3 := mul_sum lam (fun c => normSq (fun i => W i c - W0 i c))
  have h4 : (sum fun c => gramColObj G (col B c) lam (col W0 c) (col W c)) =
      sum fun c => (dot (col W c) (matVec G (col W c)) - 2 * dot (col W c) (col B c)) +
        lam * normSq (fun i => W i c - W0 i c) := rfl
  unfold gramObj
  rw [h1, h4, h2, ← h3]
  grind

/-- One column of `gram_gap`: `J_c(w) − J_c(w★) = ⟨w − w★, A (w − w★)⟩` when `A w★ = b + λw₀`. Supporting
lemma of `gram_gap` (`ridgefill.certify.rigorous_certificate`). -/
theorem gram_col_gap {d : Nat} (G : Fin d → Fin d → α) (b w0 : Fin d → α) (lam : α) {ws : Fin d → α}
    (hN : ∀ i, matVec (symAddDiag G lam) ws i = b i + lam * w0 i) (w : Fin d → α) :
    gramColObj G b lam w0 w - gramColObj G b lam w0 ws =
      dot (fun i => w i - ws i) (matVec (symAddDiag G lam) (fun i => w i - ws i)) := by
  have hq := quad_symAddDiag G lam w
  have hqs := quad_symAddDiag G lam ws
  have hn := normSq_sub w w0
  have hns := normSq_sub ws w0
  have hc : matVec (symAddDiag G lam) ws = fun i => b i + lam * w0 i := funext hN
  have hwc : dot w (fun i => b i + lam * w0 i) = dot w b + lam * dot w w0 := by
    rw [dot_add_right, dot_smul_right]
  have hwsc : dot ws (fun i => b i + lam * w0 i) = dot ws b + lam * dot ws w0 := by
    rw [dot_add_right, dot_smul_right]
  have hsym := dot_matVec_symm (symAddDiag G lam) (symAddDiag_symm G lam) ws w
  have hAe : matVec (symAddDiag G lam) (fun i => w i - ws i) =
      fun i => matVec (symAddDiag G lam) w i - matVec (symAddDiag G lam) ws i :=
    funext fun i => matVec_sub (symAddDiag G lam) w ws i
  have h1 := dot_sub_left w ws (fun i => matVec (symAddDiag G lam) w i - matVec (symAddDiag G lam) ws i)
  have h2 := dot_sub_right w (matVec (symAddDiag G lam) w) (matVec (symAddDiag G lam) ws)
  have h3 := dot_sub_right ws (matVec (symAddDiag G lam) w) (matVec (symAddDiag G lam) ws)
  rw [hAe, h1, h2, h3]
  unfold gramColObj
  rw [hn, hns]
  have k1 : dot w (matVec (symAddDiag G lam) ws) = dot w b + lam * dot w w0 := by
    rw [hc]
    exact hwc
  have k2 : dot ws (matVec (symAddDiag G lam) ws) = dot ws b + lam * dot ws w0 := by
    rw [hc]
    exact hwsc
  have k3 : dot ws (matVec (symAddDiag G lam) w) = dot w b + lam * dot w w0 := by
    rw [hsym]
    exact k1
  grind

/-- **`gram_gap`** (the objective gap of `ridgefill certify --rigorous`): for `A = ½(G + Gᵀ) + λI` and
`W★` solving `A W★ = B + λW₀`, every `W` has `J(W) − J(W★) = ‖W − W★‖²_A = Σ_c ⟨E_c, A E_c⟩`,
`E = W − W★`, for the Gram-form objective `J` (`gramObj`) of the float64 statistics. Constrains
`ridgefill.certify.rigorous_certificate` (`excess_bound`). -/
theorem gram_gap {d p : Nat} (G : Fin d → Fin d → α) (B W0 : Fin d → Fin p → α) (s lam : α)
    {Wstar : Fin d → Fin p → α}
    (hN : ∀ i c, matVec (symAddDiag G lam) (col Wstar c) i = B i c + lam * W0 i c)
    (W : Fin d → Fin p → α) :
    gramObj G B W0 s lam W - gramObj G B W0 s lam Wstar =
      aNormSq (symAddDiag G lam) (fun i c => W i c - Wstar i c) := by
  rw [gramObj_eq_sum, gramObj_eq_sum]
  have h := sum_lin 1 (-1) (fun c => gramColObj G (col B c) lam (col W0 c) (col W c))
    (fun c => gramColObj G (col B c) lam (col W0 c) (col Wstar c))
  have e : (sum fun c => gramColObj G (col B c) lam (col W0 c) (col W c)) + s -
      ((sum fun c => gramColObj G (col B c) lam (col W0 c) (col Wstar c)) + s) =
      sum fun c => 1 * gramColObj G (col B c) lam (col W0 c) (col W c) +
        -1 * gramColObj G (col B c) lam (col W0 c) (col Wstar c) := by
    rw [h]
    grind
  rw [e]
  exact sum_congr fun c => by
    have hc := gram_col_gap G (col B c) (col W0 c) lam (ws := col Wstar c) (fun i => hN i c) (col W c)
    have e2 : dot (col (fun i c => W i c - Wstar i c) c)
        (matVec (symAddDiag G lam) (col (fun i c => W i c - Wstar i c) c)) =
        dot (fun i => col W c i - col Wstar c i)
          (matVec (symAddDiag G lam) (fun i => col W c i - col Wstar c i)) := rfl
    show _ = dot (col (fun i c => W i c - Wstar i c) c)
      (matVec (symAddDiag G lam) (col (fun i c => W i c - Wstar i c) c))
    rw [e2, ← hc]
    grind

/-- The triangle inequality in squared form, over an ordered field without square roots: if
`‖a‖² ≤ s²` and `‖b‖² ≤ t²` with `s, t ≥ 0` then `‖a + b‖² ≤ (s + t)²`. Supporting lemma of
`bias_err_le` (`ridgefill.certify.rigorous_certificate`). -/
theorem normSq_add_le {n : Nat} (a b : Fin n → α) {s t : α} (hs : 0 ≤ s) (ht : 0 ≤ t)
    (ha : normSq a ≤ s * s) (hb : normSq b ≤ t * t) :
    normSq (fun i => a i + b i) ≤ (s + t) * (s + t) := by
  have e := normSq_add a b
  have hcs := dot_mul_self_le a b
  have ha0 := normSq_nonneg a
  have hb0 := normSq_nonneg b
  have hst : 0 ≤ s * t := OrderedRing.mul_nonneg hs ht
  have p1 := OrderedRing.mul_le_mul_of_nonneg_right ha hb0
  have p2 := OrderedRing.mul_le_mul_of_nonneg_left hb (OrderedRing.mul_nonneg hs hs)
  have hd : dot a b ≤ s * t := by
    apply Classical.byContradiction
    intro hlt
    have hδ : 0 < dot a b - s * t := by grind
    have q1 := OrderedRing.mul_nonneg hst (Std.le_of_lt hδ)
    have q2 := OrderedRing.mul_pos hδ hδ
    grind
  rw [e]
  grind

/-- **`bias_err_le`** (the bias bound of `ridgefill certify --rigorous`): the optimal intercept of a
map `W★` is `b★ = x̄ − h̄ W★` (`interceptMulti`); for the stored `b` and `W`, if
`‖b − (x̄ − h̄ W)‖² ≤ s²`, `‖h̄‖² ≤ η²` and `‖W − W★‖²_F ≤ e²` (`s, η, e ≥ 0`; `e` from
`gram_err_le_residual`), then `‖b − b★‖² ≤ (s + η e)²`. Constrains
`ridgefill.certify.rigorous_certificate` (`bias_error_bound`). -/
theorem bias_err_le {d p : Nat} (xbar : Fin p → α) (hbar : Fin d → α) (W Wstar : Fin d → Fin p → α)
    (b : Fin p → α) {s η e : α} (hs : 0 ≤ s) (hη : 0 ≤ η) (he : 0 ≤ e)
    (hb : normSq (fun c => b c - (xbar c - dot hbar (col W c))) ≤ s * s)
    (hh : normSq hbar ≤ η * η) (hW : frobSq (fun i c => W i c - Wstar i c) ≤ e * e) :
    normSq (fun c => b c - (xbar c - dot hbar (col Wstar c))) ≤ (s + η * e) * (s + η * e) := by
  -- b − b★ = (b − (x̄ − h̄ W)) + h̄ (W★ − W)
  have hsplit : (fun c => b c - (xbar c - dot hbar (col Wstar c))) = fun c =>
      (b c - (xbar c - dot hbar (col W c))) + dot hbar (fun i => Wstar i c - W i c) := by
    funext c
    have h := dot_sub_right hbar (col Wstar c) (col W c)
    have e1 : dot hbar (fun i => Wstar i c - W i c) = dot hbar (fun i => col Wstar c i - col W c i) := rfl
    rw [e1, h]
    grind
  have hswap : frobSq (fun i c => Wstar i c - W i c) = frobSq (fun i c => W i c - Wstar i c) :=
    sum_congr fun i => sum_congr fun c => by grind
  have hW' : frobSq (fun i c => Wstar i c - W i c) ≤ e * e := by
    rw [hswap]
    exact hW
  have hcol : normSq (fun c => dot hbar (fun i => Wstar i c - W i c)) ≤
      normSq hbar * frobSq (fun i c => Wstar i c - W i c) := by
    rw [frobSq_eq_cols, mul_sum]
    exact sum_le_sum fun c => dot_mul_self_le hbar (fun i => Wstar i c - W i c)
  have hW0 : 0 ≤ frobSq (fun i c => Wstar i c - W i c) := by
    rw [frobSq_eq_cols]
    exact sum_nonneg fun c => normSq_nonneg _
  have m1 := OrderedRing.mul_le_mul_of_nonneg_right hh hW0
  have m2 := OrderedRing.mul_le_mul_of_nonneg_left hW' (OrderedRing.mul_nonneg hη hη)
  have hbound : normSq (fun c => dot hbar (fun i => Wstar i c - W i c)) ≤ (η * e) * (η * e) := by
    grind
  rw [hsplit]
  exact normSq_add_le _ _ hs (OrderedRing.mul_nonneg hη he) hb hbound

/-- `⟨x + t y, A (x + t y)⟩ = ⟨x, A x⟩ + 2t⟨x, A y⟩ + t²⟨y, A y⟩` for a symmetric `A`. Supporting lemma of
`gram_gap_le` (`ridgefill.certify.rigorous_certificate`). -/
theorem quad_add_smul {d : Nat} (A : Fin d → Fin d → α) (hA : ∀ i j, A i j = A j i) (x y : Fin d → α) (t : α) :
    dot (fun i => x i + t * y i) (matVec A (fun i => x i + t * y i)) =
      dot x (matVec A x) + 2 * t * dot x (matVec A y) + t * t * dot y (matVec A y) := by
  have hm : matVec A (fun i => x i + t * y i) = fun k => matVec A x k + t * matVec A y k :=
    funext fun k => by rw [matVec_add A x (fun i => t * y i) k, matVec_smul A t y k]
  rw [hm]
  have h1 := dot_add_smul_left x y (fun k => matVec A x k + t * matVec A y k) t
  have h2 := dot_add_right x (matVec A x) (fun k => t * matVec A y k)
  have h3 := dot_add_right y (matVec A x) (fun k => t * matVec A y k)
  have h4 := dot_smul_right x (matVec A y) t
  have h5 := dot_smul_right y (matVec A y) t
  have h6 := dot_matVec_symm A hA y x
  rw [h1, h2, h3, h4, h5, h6]
  grind

/-- `‖X + tY‖²_A = ‖X‖²_A + 2t⟨X, Y⟩_A + t²‖Y‖²_A` for a symmetric `A`, all columns at once. Supporting
lemma of `gram_gap_le` (`ridgefill.certify.rigorous_certificate`). -/
theorem aNormSq_add_smul {d p : Nat} (A : Fin d → Fin d → α) (hA : ∀ i j, A i j = A j i)
    (X Y : Fin d → Fin p → α) (t : α) :
    aNormSq A (fun i c => X i c + t * Y i c) = aNormSq A X + 2 * t * aForm A X Y + t * t * aNormSq A Y := by
  have h := sum_eq_lin3 (F := fun c => dot (col (fun i c => X i c + t * Y i c) c)
      (matVec A (col (fun i c => X i c + t * Y i c) c))) 1 (2 * t) (t * t)
    (fun c => dot (col X c) (matVec A (col X c))) (fun c => dot (col X c) (matVec A (col Y c)))
    (fun c => dot (col Y c) (matVec A (col Y c))) (fun c => by
      have hc := quad_add_smul A hA (col X c) (col Y c) t
      show dot (fun i => col X c i + t * col Y c i) (matVec A (fun i => col X c i + t * col Y c i)) = _
      rw [hc]
      grind)
  unfold aNormSq aForm
  rw [h]
  grind

/-- `‖E‖²_A ≥ 0` when `μ‖u‖² ≤ ⟨u, A u⟩` with `μ > 0`. Supporting lemma of `gram_gap_le`
(`ridgefill.certify.rigorous_certificate`). -/
theorem aNormSq_nonneg {d p : Nat} {μ : α} (hμ : 0 < μ) (A : Fin d → Fin d → α)
    (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ dot u (matVec A u)) (E : Fin d → Fin p → α) :
    0 ≤ aNormSq A E :=
  sum_nonneg fun c => by
    have h := hcoer (col E c)
    have h0 := OrderedRing.mul_nonneg (Std.le_of_lt hμ) (normSq_nonneg (col E c))
    grind

/-- `‖e‖²_A ≤ ‖r‖² / μ` for `r = A e`, in the form `μ⟨e, A e⟩ ≤ ‖r‖²` (from `‖r − μe‖² ≥ 0` and
`μ‖e‖² ≤ ⟨e, A e⟩`). Supporting lemma of `gram_gap_le` (`ridgefill.certify.rigorous_certificate`). -/
theorem quad_le_residual {d : Nat} {μ : α} (hμ : 0 < μ) (A : Fin d → Fin d → α)
    (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ dot u (matVec A u))
    (e r : Fin d → α) (hr : ∀ i, r i = matVec A e i) :
    μ * dot e (matVec A e) ≤ normSq r := by
  have hrf : matVec A e = r := (funext hr).symm
  have hD : μ * normSq e ≤ dot e r := by
    rw [← hrf]
    exact hcoer e
  rw [hrf]
  have hexp := normSq_add_smul r e (-μ)
  have hnn := normSq_nonneg (fun i => r i + -μ * e i)
  have hc := dot_comm r e
  have hmD := OrderedRing.mul_le_mul_of_nonneg_left hD (Std.le_of_lt hμ)
  grind

/-- The cross term of a nonnegative quadratic: if `a + 2tb + t²c ≥ 0` for every `t`, `a ≤ p²` and
`0 ≤ c ≤ q²` (`p, q ≥ 0`), then `b ≤ pq` (Cauchy–Schwarz without square roots). Supporting lemma of
`gram_gap_le` (`ridgefill.certify.rigorous_certificate`). -/
theorem cross_le_of_quad {a b c p q : α} (hc0 : 0 ≤ c) (hp : 0 ≤ p) (hq : 0 ≤ q)
    (ha : a ≤ p * p) (hc : c ≤ q * q) (hquad : ∀ t : α, 0 ≤ a + 2 * t * b + t * t * c) : b ≤ p * q := by
  apply Classical.byContradiction
  intro hlt
  have hpq : 0 ≤ p * q := OrderedRing.mul_nonneg hp hq
  have hb : p * q < b := by grind
  have hbpos : 0 < b := by grind
  rcases Classical.em (c = 0) with hz | hz
  · have hb2 : 2 * b ≠ 0 := by grind
    have ht : (-(a + 1) / (2 * b)) * (2 * b) = -(a + 1) := by grind
    have h := hquad (-(a + 1) / (2 * b))
    rw [hz] at h
    grind
  · have hcpos : 0 < c := by grind
    have ht : (-b / c) * c = -b := by grind
    have h := hquad (-b / c)
    have hm := OrderedRing.mul_nonneg (Std.le_of_lt hcpos) h
    have e : c * (a + 2 * (-b / c) * b + -b / c * (-b / c) * c) = a * c - b * b := by grind
    have m1 := OrderedRing.mul_le_mul_of_nonneg_right ha hc0
    have m2 := OrderedRing.mul_le_mul_of_nonneg_left hc (OrderedRing.mul_nonneg hp hp)
    have m3 := OrderedRing.mul_pos (show 0 < b - p * q by grind) (show 0 < b + p * q by grind)
    grind

/-- **`gram_gap_le`** (the gap bound of `ridgefill certify --rigorous`, through a helper point): for
`A = ½(G + Gᵀ) + λI` with `μ‖u‖² ≤ ⟨u, A u⟩` (`μ > 0`), `W★` solving `A W★ = B + λW₀`, the stored `W` and
any helper `V` (the float64 solve): if `‖W − V‖²_A ≤ p²` and `‖R_V‖²_F ≤ μ q²` (`R_V = A V − (B + λW₀)`,
`p, q ≥ 0`), then `J(W) − J(W★) ≤ (p + q)²`, i.e. `≤ (‖W − V‖_A + ‖R_V‖_F / √μ)²`. Constrains
`ridgefill.certify.rigorous_certificate` (`excess_bound`). -/
theorem gram_gap_le {d p : Nat} (G : Fin d → Fin d → α) (B W0 : Fin d → Fin p → α) (s lam : α)
    {μ : α} (hμ : 0 < μ) (hcoer : ∀ u : Fin d → α, μ * normSq u ≤ dot u (matVec (symAddDiag G lam) u))
    {Wstar : Fin d → Fin p → α}
    (hN : ∀ i c, matVec (symAddDiag G lam) (col Wstar c) i = B i c + lam * W0 i c)
    (W V : Fin d → Fin p → α) {pp qq : α} (hp : 0 ≤ pp) (hq : 0 ≤ qq)
    (hD : aNormSq (symAddDiag G lam) (fun i c => W i c - V i c) ≤ pp * pp)
    (hR : frobSq (gramResidual (symAddDiag G lam) B W0 lam V) ≤ μ * (qq * qq)) :
    gramObj G B W0 s lam W - gramObj G B W0 s lam Wstar ≤ (pp + qq) * (pp + qq) := by
  rw [gram_gap G B W0 s lam hN W]
  have hsplit : (fun i c => W i c - Wstar i c) =
      fun i c => (W i c - V i c) + 1 * (V i c - Wstar i c) :=
    funext fun i => funext fun c => by grind
  rw [hsplit, aNormSq_add_smul (symAddDiag G lam) (symAddDiag_symm G lam)
    (fun i c => W i c - V i c) (fun i c => V i c - Wstar i c) 1]
  have hE : μ * aNormSq (symAddDiag G lam) (fun i c => V i c - Wstar i c) ≤
      frobSq (gramResidual (symAddDiag G lam) B W0 lam V) := by
    unfold aNormSq
    rw [frobSq_eq_cols, mul_sum]
    exact sum_le_sum fun c => quad_le_residual hμ (symAddDiag G lam) hcoer _ _ fun i => by
      show matVec (symAddDiag G lam) (col V c) i - (B i c + lam * W0 i c) =
        matVec (symAddDiag G lam) (fun i => col V c i - col Wstar c i) i
      rw [matVec_sub (symAddDiag G lam) (col V c) (col Wstar c) i, hN i c]
  have hc0 := aNormSq_nonneg hμ (symAddDiag G lam) hcoer (fun i c => V i c - Wstar i c)
  have hc : aNormSq (symAddDiag G lam) (fun i c => V i c - Wstar i c) ≤ qq * qq := by
    apply Classical.byContradiction
    intro hlt
    have hm := OrderedRing.mul_pos hμ
      (show 0 < aNormSq (symAddDiag G lam) (fun i c => V i c - Wstar i c) - qq * qq by grind)
    grind
  have hb := cross_le_of_quad hc0 hp hq hD hc (fun t => by
    rw [← aNormSq_add_smul (symAddDiag G lam) (symAddDiag_symm G lam)]
    exact aNormSq_nonneg hμ (symAddDiag G lam) hcoer _)
  grind

end Theorems

end KvaLean

end
