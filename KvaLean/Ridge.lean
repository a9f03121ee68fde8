module

public import KvaLean.LinAlg

public section

namespace KvaLean

open Lean.Grind

section Defs

variable {α : Type} [Field α]

/-- The ridge objective `J(w) = ‖X w − y‖² + λ ‖w − w₀‖²` for one output column. -/
@[expose] noncomputable def ridgeObj {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α)
    (lam : α) (w : Fin d → α) : α :=
  normSq (fun k => matVec X w k - y k) + lam * normSq (fun i => w i - w0 i)

/-- The normal equations `(XᵀX + λI) w = Xᵀy + λ w₀`, i.e. `(G + λI) w = B + λ w₀` with the
sufficient statistics `G = XᵀX`, `B = Xᵀy`. -/
@[expose] noncomputable def NormalEq {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α)
    (lam : α) (w : Fin d → α) : Prop :=
  ∀ i, matTVec X (matVec X w) i + lam * w i = matTVec X y i + lam * w0 i

/-- Half the gradient of `J`: `Xᵀ(Xw − y) + λ(w − w₀)`. -/
@[expose] noncomputable def ridgeGrad {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α)
    (lam : α) (w : Fin d → α) : Fin d → α :=
  fun i => matTVec X (fun k => matVec X w k - y k) i + lam * (w i - w0 i)

/-- Column `c` of a matrix. -/
@[expose] noncomputable def col {r p : Nat} (A : Fin r → Fin p → α) (c : Fin p) : Fin r → α := fun k => A k c

/-- Matrix product `X W`. -/
@[expose] noncomputable def matMul {m d p : Nat} (X : Fin m → Fin d → α) (W : Fin d → Fin p → α) :
    Fin m → Fin p → α :=
  fun k c => sum fun i => X k i * W i c

/-- Squared Frobenius norm `‖A‖²_F = ∑ₖ ∑_c A_{kc}²`. -/
@[expose] noncomputable def frobSq {r p : Nat} (A : Fin r → Fin p → α) : α := sum fun k => sum fun c => A k c * A k c

/-- The multi-output ridge objective `‖X W − Y‖²_F + λ ‖W − W₀‖²_F`. -/
@[expose] noncomputable def ridgeObjMulti {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) (lam : α) (W : Fin d → Fin p → α) : α :=
  frobSq (fun k c => matMul X W k c - Y k c) + lam * frobSq (fun i c => W i c - W0 i c)

/-- Multi-output normal equations `(XᵀX + λI) W = XᵀY + λ W₀`, column by column. -/
@[expose] noncomputable def NormalEqMulti {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) (lam : α) (W : Fin d → Fin p → α) : Prop :=
  ∀ c, NormalEq X (col Y c) (col W0 c) lam (col W c)

/-- Ridge objective with an unpenalised intercept `b`: `∑ₖ (Xₖ·w + b − yₖ)² + λ‖w − w₀‖²`. -/
@[expose] noncomputable def ridgeObjB {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α)
    (lam : α) (w : Fin d → α) (b : α) : α :=
  normSq (fun k => matVec X w k + b - y k) + lam * normSq (fun i => w i - w0 i)

/-- The number `m` as an element of the field: `card m = 1 + ⋯ + 1` (`m` terms). -/
@[expose] noncomputable def card (m : Nat) : α := sum fun _ : Fin m => (1 : α)

/-- Mean of `m` values, `(∑ₖ vₖ) / m`. -/
@[expose] noncomputable def mean {m : Nat} (v : Fin m → α) : α := sum v / card m

/-- Column means `x̄` of a data matrix. -/
@[expose] noncomputable def colMean {m d : Nat} (X : Fin m → Fin d → α) : Fin d → α := fun i => mean fun k => X k i

/-- Centred data `X − 1 x̄`. -/
@[expose] noncomputable def centre {m d : Nat} (X : Fin m → Fin d → α) : Fin m → Fin d → α :=
  fun k i => X k i - colMean X i

/-- Centred targets `y − ȳ`. -/
@[expose] noncomputable def centreVec {m : Nat} (y : Fin m → α) : Fin m → α := fun k => y k - mean y

/-- The intercept `b = ȳ − x̄ · w` fitted after centring. -/
@[expose] noncomputable def interceptOf {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w : Fin d → α) : α :=
  mean y - dot (colMean X) w

/-- The intercepts of a multi-output map fitted after centring, one per output column:
`b_c = ȳ_c − x̄·W_c`, i.e. the row vector `b = ȳ − x̄ W` that `ridgefill.ridge.fit_maps` returns
next to `W` (`X` the inputs `h_S`, `Y` the targets `x_l`). -/
@[expose] noncomputable def interceptMulti {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W : Fin d → Fin p → α) : Fin p → α :=
  fun c => interceptOf X (col Y c) (col W c)

end Defs

section Theorems

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

variable {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α) (lam : α)

/-- Exact second-order expansion `J(w + u) = J(w) + 2⟨∇, u⟩ + ‖X u‖² + λ‖u‖²` of the ridge
objective minimised by `ridgefill.ridge.solve_ridge` (`∇ = Xᵀ(Xw − y) + λ(w − w₀)`). -/
theorem ridgeObj_add (w u : Fin d → α) :
    ridgeObj X y w0 lam (fun i => w i + u i) =
      ridgeObj X y w0 lam w + 2 * dot (ridgeGrad X y w0 lam w) u + normSq (matVec X u) +
        lam * normSq u := by
  have hres : (fun k => matVec X (fun i => w i + u i) k - y k) =
      fun k => (matVec X w k - y k) + matVec X u k := funext fun k => by
    rw [matVec_add]
    grind
  have hpri : (fun i => w i + u i - w0 i) = fun i => (w i - w0 i) + u i :=
    funext fun i => by grind
  have h1 := normSq_add (fun k => matVec X w k - y k) (matVec X u)
  have h2 := normSq_add (fun i => w i - w0 i) u
  have h3 := dot_add_smul_left (matTVec X (fun k => matVec X w k - y k)) (fun i => w i - w0 i) u lam
  have h4 := dot_matVec X u (fun k => matVec X w k - y k)
  have h5 := dot_comm (fun k => matVec X w k - y k) (matVec X u)
  have h6 := dot_comm u (matTVec X (fun k => matVec X w k - y k))
  have hJ : ridgeObj X y w0 lam (fun i => w i + u i) =
      normSq (fun k => matVec X (fun i => w i + u i) k - y k) +
        lam * normSq (fun i => w i + u i - w0 i) := rfl
  have hJ0 : ridgeObj X y w0 lam w =
      normSq (fun k => matVec X w k - y k) + lam * normSq (fun i => w i - w0 i) := rfl
  have hG : ridgeGrad X y w0 lam w =
      fun i => matTVec X (fun k => matVec X w k - y k) i + lam * (w i - w0 i) := rfl
  have hres' := congrArg normSq hres
  have hpri' := congrArg normSq hpri
  first
  | (rw [hJ, hJ0, hG, hres', hpri', h1, h2, h3]; grind)
  | grind

/-- At a solution of the normal equations the gradient vanishes. Constrains
`ridgefill.ridge.solve_ridge`: solving `(G + λI)W = B + λW₀` is exactly a stationary point. -/
theorem ridgeGrad_eq_zero {w : Fin d → α} (hN : NormalEq X y w0 lam w) (i : Fin d) :
    ridgeGrad X y w0 lam w i = 0 := by
  show matTVec X (fun k => matVec X w k - y k) i + lam * (w i - w0 i) = 0
  have h1 := matTVec_sub X (matVec X w) y i
  have h2 := hN i
  grind

/-- Conversely, a vanishing gradient means the normal equations hold. Constrains
`ridgefill.ridge.solve_ridge`. -/
theorem normalEq_of_grad {w : Fin d → α} (hg : ∀ i, ridgeGrad X y w0 lam w i = 0) :
    NormalEq X y w0 lam w := by
  intro i
  have h := hg i
  have e : ridgeGrad X y w0 lam w i =
      matTVec X (fun k => matVec X w k - y k) i + lam * (w i - w0 i) := rfl
  have h1 := matTVec_sub X (matVec X w) y i
  rw [e] at h
  grind

/-- **Ridge gap.** If `w★` solves the normal equations then for every `w`,
`J w = J w★ + ‖X(w − w★)‖² + λ‖w − w★‖²`. This is what makes the closed-form solve of
`ridgefill.ridge.solve_ridge` the exact minimiser and quantifies how much worse any other map is. -/
theorem ridge_gap {wstar : Fin d → α} (hN : NormalEq X y w0 lam wstar) (w : Fin d → α) :
    ridgeObj X y w0 lam w =
      ridgeObj X y w0 lam wstar + normSq (matVec X (fun i => w i - wstar i)) +
        lam * normSq (fun i => w i - wstar i) := by
  have e : (fun i => wstar i + (w i - wstar i)) = w := funext fun i => by grind
  have hw : ridgeObj X y w0 lam (fun i => wstar i + (w i - wstar i)) = ridgeObj X y w0 lam w :=
    congrArg (ridgeObj X y w0 lam) e
  have hg := dot_zero_left (ridgeGrad_eq_zero X y w0 lam hN) (fun i => w i - wstar i)
  have h := ridgeObj_add X y w0 lam wstar (fun i => w i - wstar i)
  first
  | (rw [← hw, h, hg]; grind)
  | grind

/-- **Ridge optimality.** For `λ ≥ 0`, a solution of the normal equations minimises
`‖Xw − y‖² + λ‖w − w₀‖²`. Constrains `ridgefill.ridge.solve_ridge`: its output is a global
minimiser of the identity-centred ridge objective. -/
theorem ridge_optimal (hlam : 0 ≤ lam) {wstar : Fin d → α} (hN : NormalEq X y w0 lam wstar)
    (w : Fin d → α) : ridgeObj X y w0 lam wstar ≤ ridgeObj X y w0 lam w := by
  have h := ridge_gap X y w0 lam hN w
  have h1 := normSq_nonneg (matVec X (fun i => w i - wstar i))
  have h2 := OrderedRing.mul_nonneg hlam (normSq_nonneg (fun i => w i - wstar i))
  grind

/-- **Ridge uniqueness.** For `λ > 0` the normal equations have at most one solution.
Constrains `ridgefill.ridge.solve_ridge`: with `λ > 0` its answer does not depend on the solver. -/
theorem ridge_unique (hlam : 0 < lam) {w₁ w₂ : Fin d → α} (h₁ : NormalEq X y w0 lam w₁)
    (h₂ : NormalEq X y w0 lam w₂) : w₁ = w₂ := by
  have g1 := ridge_gap X y w0 lam h₁ w₂
  have g2 := ridge_gap X y w0 lam h₂ w₁
  have a1 := normSq_nonneg (matVec X (fun i => w₂ i - w₁ i))
  have a2 := normSq_nonneg (matVec X (fun i => w₁ i - w₂ i))
  have b1 := normSq_nonneg (fun i => w₂ i - w₁ i)
  have b2 := normSq_nonneg (fun i => w₁ i - w₂ i)
  have c1 := OrderedRing.mul_nonneg (Std.le_of_lt hlam) b1
  have c2 := OrderedRing.mul_nonneg (Std.le_of_lt hlam) b2
  have hB : normSq (fun i => w₂ i - w₁ i) = 0 := by
    apply Classical.byContradiction
    intro hne
    have hpos : 0 < normSq (fun i => w₂ i - w₁ i) := by grind
    have := OrderedRing.mul_pos hlam hpos
    grind
  have hz := (normSq_eq_zero_iff _).mp hB
  funext i
  have := hz i
  grind

/-- A nonnegative quadratic `2 t a + t² q ≥ 0` for all `t` (with `a, q ≥ 0`) forces `a = 0`.
The one-dimensional step of `normal_eq_of_isMin`, behind `ridgefill.ridge.solve_ridge`. -/
theorem quad_nonneg_forces_zero {a q : α} (ha : 0 ≤ a) (hq : 0 ≤ q)
    (h : ∀ t : α, 0 ≤ 2 * t * a + t * t * q) : a = 0 := by
  have hq1 : q + 1 ≠ 0 := by grind
  obtain ⟨s, hs⟩ : ∃ s : α, s * (q + 1) = a := ⟨a / (q + 1), by grind⟩
  subst hs
  have h1 := h (-s)
  have hss := mul_self_nonneg s
  have hssq := OrderedRing.mul_nonneg hss hq
  have h2 : s * s = 0 := by grind
  have h3 : s = 0 := mul_self_eq_zero.mp h2
  rw [h3]
  grind

/-- **Every minimiser satisfies the normal equations.** If `w` minimises the ridge objective
(`λ ≥ 0`), then `(XᵀX + λI) w = Xᵀy + λw₀`. Constrains `ridgefill.ridge.solve_ridge`: solving
the normal equations loses no minimiser. -/
theorem normal_eq_of_isMin (hlam : 0 ≤ lam) {w : Fin d → α}
    (hmin : ∀ v : Fin d → α, ridgeObj X y w0 lam w ≤ ridgeObj X y w0 lam v) :
    NormalEq X y w0 lam w := by
  apply normalEq_of_grad
  have ha := normSq_nonneg (ridgeGrad X y w0 lam w)
  have hq := normSq_nonneg (matVec X (ridgeGrad X y w0 lam w))
  have hq2 := OrderedRing.mul_nonneg hlam ha
  have key : normSq (ridgeGrad X y w0 lam w) = 0 := by
    apply quad_nonneg_forces_zero ha (q := normSq (matVec X (ridgeGrad X y w0 lam w)) +
      lam * normSq (ridgeGrad X y w0 lam w)) (by grind)
    intro t
    have h := hmin (fun i => w i + t * ridgeGrad X y w0 lam w i)
    rw [ridgeObj_add] at h
    have e1 := dot_smul_right (ridgeGrad X y w0 lam w) (ridgeGrad X y w0 lam w) t
    have e2 : matVec X (fun i => t * ridgeGrad X y w0 lam w i) =
        fun k => t * matVec X (ridgeGrad X y w0 lam w) k :=
      funext fun k => matVec_smul X t _ k
    have e3 := normSq_smul t (matVec X (ridgeGrad X y w0 lam w))
    have e4 := normSq_smul t (ridgeGrad X y w0 lam w)
    have e5 : dot (ridgeGrad X y w0 lam w) (ridgeGrad X y w0 lam w) =
        normSq (ridgeGrad X y w0 lam w) := rfl
    rw [e2, e1, e3, e4, e5] at h
    grind
  exact (normSq_eq_zero_iff _).mp key

/-- **Unique minimiser.** For `λ > 0`, any minimiser of the ridge objective equals the
normal-equation solution `w★`. Constrains `ridgefill.ridge.solve_ridge`. -/
theorem ridge_isMin_unique (hlam : 0 < lam) {w wstar : Fin d → α}
    (hN : NormalEq X y w0 lam wstar)
    (hmin : ∀ v : Fin d → α, ridgeObj X y w0 lam w ≤ ridgeObj X y w0 lam v) : w = wstar :=
  ridge_unique X y w0 lam hlam (normal_eq_of_isMin X y w0 lam (Std.le_of_lt hlam) hmin) hN

end Theorems

section Multi

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

variable {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α) (W0 : Fin d → Fin p → α)
  (lam : α)

/-- The Frobenius objective is the sum over output columns of the single-column objectives.
Constrains `ridgefill.ridge.solve_ridge`, which solves all columns of `W` at once. -/
theorem ridgeObjMulti_eq_sum (W : Fin d → Fin p → α) :
    ridgeObjMulti X Y W0 lam W = sum fun c => ridgeObj X (col Y c) (col W0 c) lam (col W c) := by
  have h1 : frobSq (fun k c => matMul X W k c - Y k c) =
      sum fun c => normSq (fun k => matVec X (col W c) k - col Y c k) :=
    sum_comm (fun k c => (matMul X W k c - Y k c) * (matMul X W k c - Y k c))
  have h2 : frobSq (fun i c => W i c - W0 i c) =
      sum fun c => normSq (fun i => col W c i - col W0 c i) :=
    sum_comm (fun i c => (W i c - W0 i c) * (W i c - W0 i c))
  have h3 := sum_lin 1 lam (fun c => normSq (fun k => matVec X (col W c) k - col Y c k))
    (fun c => normSq (fun i => col W c i - col W0 c i))
  have e : ridgeObjMulti X Y W0 lam W =
      frobSq (fun k c => matMul X W k c - Y k c) + lam * frobSq (fun i c => W i c - W0 i c) := rfl
  have e2 : (sum fun c => ridgeObj X (col Y c) (col W0 c) lam (col W c)) =
      sum fun c => 1 * normSq (fun k => matVec X (col W c) k - col Y c k) +
        lam * normSq (fun i => col W c i - col W0 c i) :=
    sum_congr fun c => by
      show normSq (fun k => matVec X (col W c) k - col Y c k) +
          lam * normSq (fun i => col W c i - col W0 c i) = _
      grind
  rw [e, e2, h3, h1, h2]
  grind

/-- **Multi-output ridge optimality.** For `λ ≥ 0`, a matrix `W` solving
`(XᵀX + λI) W = XᵀY + λW₀` minimises `‖XW − Y‖²_F + λ‖W − W₀‖²_F`. Constrains
`ridgefill.ridge.solve_ridge` (all output columns of one layer's map `W_l`). -/
theorem ridge_multi_optimal (hlam : 0 ≤ lam) {W : Fin d → Fin p → α}
    (hN : NormalEqMulti X Y W0 lam W) (V : Fin d → Fin p → α) :
    ridgeObjMulti X Y W0 lam W ≤ ridgeObjMulti X Y W0 lam V := by
  rw [ridgeObjMulti_eq_sum, ridgeObjMulti_eq_sum]
  exact sum_le_sum fun c => ridge_optimal X (col Y c) (col W0 c) lam hlam (hN c) (col V c)

/-- **Multi-output uniqueness.** For `λ > 0` the multi-output normal equations have at most one
solution. Constrains `ridgefill.ridge.solve_ridge`. -/
theorem ridge_multi_unique (hlam : 0 < lam) {W₁ W₂ : Fin d → Fin p → α}
    (h₁ : NormalEqMulti X Y W0 lam W₁) (h₂ : NormalEqMulti X Y W0 lam W₂) : W₁ = W₂ := by
  funext i c
  have h := ridge_unique X (col Y c) (col W0 c) lam hlam (h₁ c) (h₂ c)
  exact congrFun h i

end Multi

section Intercept

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- `card m > 0` for `m > 0`: the row count used by the centring in `ridgefill.ridge.fit_maps`
is invertible. -/
theorem card_pos : ∀ {m : Nat}, 0 < m → (0 : α) < card m
  | 0, h => absurd h (Nat.lt_irrefl 0)
  | m + 1, _ => by
    have h1 : (0 : α) ≤ card m :=
      sum_nonneg (f := fun _ : Fin m => (1 : α)) fun _ => OrderedRing.zero_le_one
    have h2 : (0 : α) < 1 := OrderedRing.zero_lt_one
    have e : (card (m + 1) : α) = card m + 1 := rfl
    rw [e]
    grind

/-- Completing the square in the intercept: with `b★ = −(∑ rₖ)/m`,
`∑ (rₖ + b)² = ∑ (rₖ + b★)² + m (b − b★)²`. Behind the centring step of
`ridgefill.ridge.fit_maps`. -/
theorem sum_sq_shift {m : Nat} (hm : 0 < m) (r : Fin m → α) (b : α) :
    normSq (fun k => r k + b) =
      normSq (fun k => r k + -(sum r / card m)) + card m * ((b + sum r / card m) *
        (b + sum r / card m)) := by
  have hm' : (card m : α) ≠ 0 := by
    have := card_pos (α := α) hm
    grind
  have expand : ∀ c : α, normSq (fun k => r k + c) =
      normSq r + 2 * c * sum r + c * c * card m := by
    intro c
    have h := sum_eq_lin3 (F := fun k => (r k + c) * (r k + c)) 1 (2 * c) (c * c)
      (fun k => r k * r k) r (fun _ => (1 : α)) (fun k => by grind)
    have e1 : normSq (fun k => r k + c) = sum fun k => (r k + c) * (r k + c) := rfl
    have e2 : normSq r = sum fun k => r k * r k := rfl
    have e3 : (card m : α) = sum fun _ : Fin m => (1 : α) := rfl
    rw [e1, e2, e3, h]
    grind
  rw [expand b, expand (-(sum r / card m))]
  have hs : sum r = card m * (sum r / card m) := by grind
  generalize sum r / card m = q at hs ⊢
  rw [hs]
  grind

/-- The residual sum at weights `w` is `−m` times the fitted intercept `ȳ − x̄·w`:
`∑ₖ (Xₖ·w − yₖ) = m (x̄·w − ȳ)`. Used by the centring of `ridgefill.ridge.fit_maps`. -/
theorem sum_residual_eq {m d : Nat} (hm : 0 < m) (X : Fin m → Fin d → α) (y : Fin m → α)
    (w : Fin d → α) :
    sum (fun k => matVec X w k - y k) = card m * (-(interceptOf X y w)) := by
  have hm' : (card m : α) ≠ 0 := by
    have := card_pos (α := α) hm
    grind
  have h1 := dot_matVec X w (fun _ => (1 : α))
  have h2 : dot (matVec X w) (fun _ => (1 : α)) = sum (matVec X w) :=
    sum_congr fun k => by grind
  have h3 : dot w (matTVec X (fun _ => (1 : α))) = card m * dot (colMean X) w := by
    show (sum fun i => w i * sum fun k => X k i * 1) =
      card m * sum fun i => (sum fun k => X k i) / card m * w i
    rw [mul_sum]
    exact sum_congr fun i => by
      have e : (sum fun k => X k i * 1) = sum fun k => X k i := sum_congr fun k => by grind
      rw [e]
      grind
  have h4 := sum_lin_of (F := fun k => matVec X w k - y k) 1 (-1) (matVec X w) y
    (fun k => by grind)
  have h6 : mean y = sum y / card m := rfl
  have h7 : interceptOf X y w = mean y - dot (colMean X) w := rfl
  grind

/-- **Centring (intercept) step of `ridgefill.ridge.fit_maps`.** For any weights `w` (and
`m > 0` rows), the intercept `b = ȳ − x̄·w` minimises the intercept ridge objective over `b`:
`J(w, ȳ − x̄·w) ≤ J(w, b)`. -/
theorem intercept_optimal {m d : Nat} (hm : 0 < m) (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) (lam : α) (w : Fin d → α) (b : α) :
    ridgeObjB X y w0 lam w (interceptOf X y w) ≤ ridgeObjB X y w0 lam w b := by
  have hmpos := card_pos (α := α) hm
  have hm' : (card m : α) ≠ 0 := by grind
  have hsum := sum_residual_eq hm X y w
  have hshift : normSq (fun k => (matVec X w k - y k) + b) =
      normSq (fun k => (matVec X w k - y k) + -(sum (fun k => matVec X w k - y k) / card m)) +
        card m * ((b + sum (fun k => matVec X w k - y k) / card m) *
          (b + sum (fun k => matVec X w k - y k) / card m)) :=
    sum_sq_shift hm (fun k => matVec X w k - y k) b
  have hb : -(sum (fun k => matVec X w k - y k) / card m) = interceptOf X y w := by
    rw [hsum]
    grind
  rw [hb] at hshift
  have e1 : ridgeObjB X y w0 lam w b =
      normSq (fun k => (matVec X w k - y k) + b) + lam * normSq (fun i => w i - w0 i) := by
    have e : (fun k => matVec X w k + b - y k) = fun k => (matVec X w k - y k) + b :=
      funext fun k => by grind
    show normSq (fun k => matVec X w k + b - y k) + lam * normSq (fun i => w i - w0 i) = _
    rw [congrArg normSq e]
  have e2 : ridgeObjB X y w0 lam w (interceptOf X y w) =
      normSq (fun k => (matVec X w k - y k) + interceptOf X y w) +
        lam * normSq (fun i => w i - w0 i) := by
    have e : (fun k => matVec X w k + interceptOf X y w - y k) =
        fun k => (matVec X w k - y k) + interceptOf X y w :=
      funext fun k => by grind
    show normSq (fun k => matVec X w k + interceptOf X y w - y k) +
      lam * normSq (fun i => w i - w0 i) = _
    rw [congrArg normSq e]
  have hsq := mul_self_nonneg (b + sum (fun k => matVec X w k - y k) / card m)
  have hprod := OrderedRing.mul_nonneg (Std.le_of_lt hmpos) hsq
  rw [e1, e2]
  first
  | (rw [hshift]; grind)
  | grind

/-- With the fitted intercept, the intercept objective equals the plain ridge objective on
centred data: `J(w, ȳ − x̄·w) = ‖(X − x̄) w − (y − ȳ)‖² + λ‖w − w₀‖²`. This is the centring
performed by `ridgefill.ridge.fit_maps` before calling `ridgefill.ridge.solve_ridge`. -/
theorem interceptObj_eq_centred {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) (lam : α) (w : Fin d → α) :
    ridgeObjB X y w0 lam w (interceptOf X y w) = ridgeObj (centre X) (centreVec y) w0 lam w := by
  have e : (fun k => matVec X w k + interceptOf X y w - y k) =
      fun k => matVec (centre X) w k - centreVec y k := funext fun k => by
    have h := dot_add_smul_left (X k) (colMean X) w (-1)
    have h1 : (fun i => X k i + -1 * colMean X i) = centre X k :=
      funext fun i => by
        show X k i + -1 * colMean X i = X k i - colMean X i
        grind
    have h' : dot (centre X k) w = dot (X k) w + -1 * dot (colMean X) w :=
      (congrArg (fun v => dot v w) h1.symm).trans h
    show dot (X k) w + (mean y - dot (colMean X) w) - y k = dot (centre X k) w - (y k - mean y)
    rw [h']
    grind
  show normSq (fun k => matVec X w k + interceptOf X y w - y k) +
    lam * normSq (fun i => w i - w0 i) = _
  rw [congrArg normSq e]
  try rfl

/-- **`fit_maps` optimality.** If `w★` solves the ridge normal equations on centred data
(`m > 0`, `λ ≥ 0`) and `b★ = ȳ − x̄·w★`, then `(w★, b★)` minimises
`∑ₖ (Xₖ·w + b − yₖ)² + λ‖w − w₀‖²` over all `(w, b)`. Constrains `ridgefill.ridge.fit_maps`
(centring + intercept + per-layer `ridgefill.ridge.solve_ridge`), one output column at a time. -/
theorem fit_maps_optimal {m d : Nat} (hm : 0 < m) (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) (lam : α) (hlam : 0 ≤ lam) {wstar : Fin d → α}
    (hN : NormalEq (centre X) (centreVec y) w0 lam wstar) (w : Fin d → α) (b : α) :
    ridgeObjB X y w0 lam wstar (interceptOf X y wstar) ≤ ridgeObjB X y w0 lam w b := by
  have h1 := intercept_optimal hm X y w0 lam w b
  have h2 := interceptObj_eq_centred X y w0 lam w
  have h3 := interceptObj_eq_centred X y w0 lam wstar
  have h4 := ridge_optimal (centre X) (centreVec y) w0 lam hlam hN w
  rw [h3]
  rw [h2] at h1
  first
  | exact Std.le_trans h4 h1
  | grind

end Intercept

section Streaming

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- **`sum_sub_mul_sub`** (second moments about any point from running sums): for rows `a`, `b` and
points `p`, `q`, `∑ₖ (aₖ − p)(bₖ − q) = ∑ₖ aₖbₖ − q ∑ₖ aₖ − p ∑ₖ bₖ + m p q`. Entry by entry, this is
what `ridgefill.ridge.RidgeStats.moments` computes from the shifted sums (`a = h − shift_h`,
`b = x_l − shift_x`, `p = m_h − shift_h`, `q = m_x − shift_x`), and, with `p = −δ`, `q = −ε`, how
`RidgeStats.merged` re-expresses another chunk's sums about a new shift. -/
theorem sum_sub_mul_sub {m : Nat} (a b : Fin m → α) (p q : α) :
    (sum fun k => (a k - p) * (b k - q)) =
      (sum fun k => a k * b k) - q * sum a - p * sum b + card m * (p * q) := by
  have h1 := sum_lin_of (F := fun k => (a k - p) * (b k - q)) 1 (p * q)
    (fun k => (a k - p) * (b k - q) - p * q) (fun _ => (1 : α)) (fun k => by grind)
  have h2 := sum_eq_lin3 (F := fun k => (a k - p) * (b k - q) - p * q) 1 (-q) (-p)
    (fun k => a k * b k) a b (fun k => by grind)
  have e3 : (card m : α) = sum fun _ : Fin m => (1 : α) := rfl
  rw [e3]
  grind

/-- **`sum_append`**: a sum over `m + n` rows is the sum over the first `m` plus the sum over the
last `n`, so running sums of two chunks add up (`ridgefill.ridge.RidgeStats.merged`, once both are
about the same shift, `sum_sub_mul_sub`). -/
theorem sum_append : ∀ {m n : Nat} (f : Fin (m + n) → α),
    sum f = (sum fun i : Fin m => f (Fin.castAdd n i)) + sum fun j : Fin n => f (Fin.natAdd m j)
  | m, 0, f => by
    show sum f = (sum fun i : Fin m => f (Fin.castAdd 0 i)) + 0
    have e : (sum fun i : Fin m => f (Fin.castAdd 0 i)) = sum f := rfl
    rw [e]
    grind
  | m, n + 1, f => by
    have ih : sum (fun i : Fin (m + n) => f i.castSucc) =
        (sum fun i : Fin m => f (Fin.castAdd n i).castSucc) +
          sum fun j : Fin n => f (Fin.natAdd m j).castSucc :=
      sum_append (fun i : Fin (m + n) => f i.castSucc)
    have e0 : sum f = sum (fun i : Fin (m + n) => f i.castSucc) + f (Fin.last (m + n)) := rfl
    have e1 : (sum fun i : Fin m => f (Fin.castAdd n i).castSucc) =
        sum fun i : Fin m => f (Fin.castAdd (n + 1) i) := rfl
    have e2 : (sum fun j : Fin (n + 1) => f (Fin.natAdd m j)) =
        (sum fun j : Fin n => f (Fin.natAdd m j).castSucc) + f (Fin.last (m + n)) := rfl
    rw [e0, ih, e1, e2]
    grind

/-- **`ridge_update`** (more statistics, `ridgefill.ridge.solve_ridge` on `RidgeStats.merged`):
the ridge normal equations on statistics `G`, `B` (a Gram matrix and one column of the cross term)
are `(G + λI) w = B + λ w₀`. Add the statistics `ΔG`, `ΔB` of more rows (merged as `sum_append` and
`sum_sub_mul_sub` describe). If `w` solves the old equations and `u` solves
`(G + ΔG + λI) u = ΔB − ΔG w`, then `w + u` solves the merged equations
`(G + ΔG + λI)(w + u) = (B + ΔB) + λ w₀`. So the solve on merged statistics is the update of the first
fit by a correction that needs the first map `w`, its Gram `G` and the new rows only, never the first
cross term; by `ridge_multi_optimal` and `fit_maps_optimal` it is the ridge optimum over all the rows.
Constrains `ridgefill.ridge.solve_ridge`. -/
theorem ridge_update {d : Nat} (G dG : Fin d → Fin d → α) (B dB w0 w u : Fin d → α) (lam : α)
    (hw : ∀ i, (sum fun j => G i j * w j) + lam * w i = B i + lam * w0 i)
    (hu : ∀ i, (sum fun j => (G i j + dG i j) * u j) + lam * u i = dB i - sum fun j => dG i j * w j) :
    ∀ i, (sum fun j => (G i j + dG i j) * (w j + u j)) + lam * (w i + u i) = (B i + dB i) + lam * w0 i := by
  intro i
  have e := sum_eq_lin3 (F := fun j => (G i j + dG i j) * (w j + u j)) 1 1 1
    (fun j => G i j * w j) (fun j => dG i j * w j) (fun j => (G i j + dG i j) * u j) (fun j => by grind)
  have h1 := hw i
  have h2 := hu i
  grind

end Streaming

end KvaLean

end
