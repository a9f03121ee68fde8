module

public section

namespace KvaLean

open Lean.Grind

section Defs

variable {α : Type} [Field α]

/-- `sum f = f 0 + ⋯ + f (n-1)`, by structural recursion on `n` (the last term is added last). -/
@[expose] noncomputable def sum : {n : Nat} → (Fin n → α) → α
  | 0, _ => 0
  | n + 1, f => sum (fun i : Fin n => f i.castSucc) + f (Fin.last n)

/-- Dot product `⟨u, v⟩ = ∑ᵢ uᵢ vᵢ`. -/
@[expose] noncomputable def dot {n : Nat} (u v : Fin n → α) : α := sum fun i => u i * v i

/-- Squared Euclidean norm `‖u‖² = ⟨u, u⟩`. -/
@[expose] noncomputable def normSq {n : Nat} (u : Fin n → α) : α := dot u u

/-- `X w` for `X : m × d` (rows `X k`) and `w : d`. -/
@[expose] noncomputable def matVec {m d : Nat} (X : Fin m → Fin d → α) (w : Fin d → α) : Fin m → α :=
  fun k => dot (X k) w

/-- `Xᵀ r` for `X : m × d` and `r : m`. -/
@[expose] noncomputable def matTVec {m d : Nat} (X : Fin m → Fin d → α) (r : Fin m → α) : Fin d → α :=
  fun i => sum fun k => X k i * r k

/-- The per-row affine predictor `x̂ = h W + b` (row vector `h : d`, `W : d × p`, `b : p`). -/
@[expose] noncomputable def affineMap {d p : Nat} (W : Fin d → Fin p → α) (b : Fin p → α) (h : Fin d → α) :
    Fin p → α :=
  fun c => (sum fun i => h i * W i c) + b c

/-- The identity matrix. -/
@[expose] noncomputable def idMat {n : Nat} : Fin n → Fin n → α := fun i j => if i.val = j.val then 1 else 0

end Defs

section Basic

variable {α : Type} [Field α]

/-- Case split on `Fin (n+1)`: an index is a lifted `Fin n` index or the last one.
Substrate for the sum lemmas behind `ridgefill.ridge.solve_ridge`. -/
theorem fin_cases_last {n : Nat} (i : Fin (n + 1)) :
    (∃ j : Fin n, i = j.castSucc) ∨ i = Fin.last n := by
  by_cases hi : i.val < n
  · exact Or.inl ⟨⟨i.val, hi⟩, Fin.eq_of_val_eq rfl⟩
  · refine Or.inr (Fin.eq_of_val_eq ?_)
    have h2 := i.isLt
    show i.val = n
    omega

/-- The empty sum is `0`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_zero_dim (f : Fin 0 → α) : sum f = 0 := rfl

/-- Peel off the last term of a sum. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_succ {n : Nat} (f : Fin (n + 1) → α) :
    sum f = sum (fun i : Fin n => f i.castSucc) + f (Fin.last n) := rfl

/-- Sums of pointwise equal terms are equal. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_congr {n : Nat} {f g : Fin n → α} (h : ∀ i, f i = g i) : sum f = sum g := by
  have e : f = g := funext h
  rw [e]

end Basic

section Lemmas

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- A sum of zeros is zero. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_const_zero : ∀ {n : Nat}, (sum fun _ : Fin n => (0 : α)) = 0
  | 0 => rfl
  | n + 1 => by
    rw [sum_succ, sum_const_zero (n := n)]
    grind

/-- Linearity of the finite sum: `∑ (a fᵢ + b gᵢ) = a ∑ f + b ∑ g`.
Substrate for `ridgefill.ridge.solve_ridge` (sufficient statistics are sums over rows). -/
theorem sum_lin : ∀ {n : Nat} (a b : α) (f g : Fin n → α),
    (sum fun i => a * f i + b * g i) = a * sum f + b * sum g
  | 0, a, b, f, g => by
    show (0 : α) = a * 0 + b * 0
    grind
  | n + 1, a, b, f, g => by
    rw [sum_succ (fun i => a * f i + b * g i), sum_succ f, sum_succ g,
      sum_lin a b (fun i => f i.castSucc) (fun i => g i.castSucc)]
    grind

/-- Linearity in the form used for rewriting: if `Fᵢ = a fᵢ + b gᵢ` pointwise then
`∑ F = a ∑ f + b ∑ g`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_lin_of {n : Nat} {F : Fin n → α} (a b : α) (f g : Fin n → α)
    (hF : ∀ i, F i = a * f i + b * g i) : sum F = a * sum f + b * sum g :=
  (sum_congr hF).trans (sum_lin a b f g)

/-- Additivity of the finite sum. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_add {n : Nat} (f g : Fin n → α) :
    (sum fun i => f i + g i) = sum f + sum g := by
  have h := sum_lin_of (F := fun i => f i + g i) 1 1 f g (fun i => by grind)
  grind

/-- Pulling a constant out of a sum (left). Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem mul_sum {n : Nat} (c : α) (f : Fin n → α) :
    c * sum f = sum fun i => c * f i := by
  have h := sum_lin_of (F := fun i => c * f i) c 0 f f (fun i => by grind)
  grind

/-- Pulling a constant out of a sum (right). Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem sum_mul {n : Nat} (f : Fin n → α) (c : α) :
    sum f * c = sum fun i => f i * c := by
  have h := sum_lin_of (F := fun i => f i * c) c 0 f f (fun i => by grind)
  grind

/-- Three-term linearity: if `Fᵢ = a fᵢ + b gᵢ + c hᵢ` then `∑ F = a ∑ f + b ∑ g + c ∑ h`.
Used to expand the quadratic ridge objective of `ridgefill.ridge.solve_ridge`. -/
theorem sum_eq_lin3 {n : Nat} {F : Fin n → α} (a b c : α) (f g h : Fin n → α)
    (hF : ∀ i, F i = a * f i + b * g i + c * h i) :
    sum F = a * sum f + b * sum g + c * sum h := by
  have h1 := sum_lin_of (F := F) 1 c (fun i => a * f i + b * g i) h (fun i => by rw [hF i]; grind)
  have h2 := sum_lin a b f g
  grind

/-- Swapping a double finite sum (Fubini for finite sums). Used to move `Xᵀ` across a dot
product in the normal equations solved by `ridgefill.ridge.solve_ridge`. -/
theorem sum_comm : ∀ {m n : Nat} (f : Fin m → Fin n → α),
    (sum fun i => sum fun j => f i j) = sum fun j => sum fun i => f i j
  | 0, n, f => by
    show (0 : α) = sum fun _ : Fin n => (0 : α)
    rw [sum_const_zero]
  | m + 1, n, f => by
    rw [sum_succ (fun i => sum fun j => f i j), sum_comm (fun i j => f i.castSucc j), ← sum_add]
    rfl

/-- A sum of nonnegative terms is nonnegative. Substrate for the optimality of
`ridgefill.ridge.solve_ridge`. -/
theorem sum_nonneg : ∀ {n : Nat} {f : Fin n → α}, (∀ i, 0 ≤ f i) → 0 ≤ sum f
  | 0, f, _ => by
    show (0 : α) ≤ 0
    grind
  | n + 1, f, h => by
    rw [sum_succ]
    have h1 := sum_nonneg (f := fun i : Fin n => f i.castSucc) (fun i => h _)
    have h2 := h (Fin.last n)
    grind

/-- Termwise comparison of sums. Used to sum the per-column optimality of
`ridgefill.ridge.solve_ridge` into the Frobenius (multi-output) statement. -/
theorem sum_le_sum : ∀ {n : Nat} {f g : Fin n → α}, (∀ i, f i ≤ g i) → sum f ≤ sum g
  | 0, f, g, _ => by
    show (0 : α) ≤ 0
    grind
  | n + 1, f, g, h => by
    rw [sum_succ f, sum_succ g]
    have h1 := sum_le_sum (f := fun i : Fin n => f i.castSucc) (g := fun i => g i.castSucc)
      (fun i => h _)
    have h2 := h (Fin.last n)
    grind

/-- A sum of nonnegative terms vanishes only if every term vanishes. Substrate for the
uniqueness of the `ridgefill.ridge.solve_ridge` solution. -/
theorem sum_eq_zero_iff_of_nonneg : ∀ {n : Nat} {f : Fin n → α}, (∀ i, 0 ≤ f i) →
    (sum f = 0 ↔ ∀ i, f i = 0)
  | 0, f, _ => by
    constructor
    · intro _ i
      exact i.elim0
    · intro _
      rfl
  | n + 1, f, h => by
    rw [sum_succ]
    have h1 := sum_nonneg (f := fun i : Fin n => f i.castSucc) (fun i => h _)
    have h2 := h (Fin.last n)
    have ih := sum_eq_zero_iff_of_nonneg (f := fun i : Fin n => f i.castSucc) (fun i => h _)
    constructor
    · intro hs i
      have hA : sum (fun i : Fin n => f i.castSucc) = 0 := by grind
      have hB : f (Fin.last n) = 0 := by grind
      rcases fin_cases_last i with ⟨j, rfl⟩ | rfl
      · exact ih.mp hA j
      · exact hB
    · intro hz
      have hA : sum (fun i : Fin n => f i.castSucc) = 0 := ih.mpr (fun j => hz _)
      rw [hA, hz (Fin.last n)]
      grind

/-- `0 ≤ a * a` in a linearly ordered field. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem mul_self_nonneg (a : α) : 0 ≤ a * a := by
  first
  | (have h := OrderedRing.sq_nonneg (a := a); rw [Semiring.pow_two] at h; exact h)
  | (cases Std.le_total (a := (0 : α)) (b := a) with
      | inl h => exact OrderedRing.mul_nonneg h h
      | inr h => exact OrderedRing.mul_nonneg_of_nonpos_of_nonpos h h)

/-- `a * a = 0 ↔ a = 0` in a linearly ordered field. Substrate for the uniqueness of the
`ridgefill.ridge.solve_ridge` solution. -/
theorem mul_self_eq_zero {a : α} : a * a = 0 ↔ a = 0 := by
  constructor
  · intro h
    apply Classical.byContradiction
    intro hne
    have hp := OrderedRing.sq_pos (a := a) hne
    rw [Semiring.pow_two] at hp
    grind
  · intro h
    rw [h]
    grind

/-- Squared norms are nonnegative. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem normSq_nonneg {n : Nat} (u : Fin n → α) : 0 ≤ normSq u :=
  sum_nonneg fun i => mul_self_nonneg (u i)

/-- `‖u‖² = 0` iff `u = 0` componentwise. Substrate for the uniqueness of the
`ridgefill.ridge.solve_ridge` solution. -/
theorem normSq_eq_zero_iff {n : Nat} (u : Fin n → α) : normSq u = 0 ↔ ∀ i, u i = 0 := by
  have h := sum_eq_zero_iff_of_nonneg (f := fun i => u i * u i) (fun i => mul_self_nonneg (u i))
  constructor
  · intro hz i
    exact mul_self_eq_zero.mp (h.mp hz i)
  · intro hz
    exact h.mpr fun i => mul_self_eq_zero.mpr (hz i)

/-- Symmetry of the dot product. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem dot_comm {n : Nat} (u v : Fin n → α) : dot u v = dot v u :=
  sum_congr fun i => by grind

/-- Dot product with the zero vector. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem dot_zero_left {n : Nat} {g : Fin n → α} (hg : ∀ i, g i = 0) (u : Fin n → α) :
    dot g u = 0 := by
  show (sum fun i => g i * u i) = 0
  exact (sum_congr fun i => (by rw [hg i]; grind : g i * u i = 0)).trans sum_const_zero

/-- `⟨a + c b, u⟩ = ⟨a, u⟩ + c ⟨b, u⟩`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem dot_add_smul_left {n : Nat} (a b u : Fin n → α) (c : α) :
    dot (fun i => a i + c * b i) u = dot a u + c * dot b u := by
  show (sum fun i => (a i + c * b i) * u i) = (sum fun i => a i * u i) + c * sum fun i => b i * u i
  have h := sum_lin_of (F := fun i => (a i + c * b i) * u i) 1 c (fun i => a i * u i)
    (fun i => b i * u i) (fun i => by grind)
  grind

/-- `⟨u, a + b⟩ = ⟨u, a⟩ + ⟨u, b⟩`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem dot_add_right {n : Nat} (u a b : Fin n → α) :
    dot u (fun i => a i + b i) = dot u a + dot u b := by
  show (sum fun i => u i * (a i + b i)) = (sum fun i => u i * a i) + sum fun i => u i * b i
  have h := sum_lin_of (F := fun i => u i * (a i + b i)) 1 1 (fun i => u i * a i)
    (fun i => u i * b i) (fun i => by grind)
  grind

/-- `⟨u, t v⟩ = t ⟨u, v⟩`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem dot_smul_right {n : Nat} (u v : Fin n → α) (t : α) :
    dot u (fun i => t * v i) = t * dot u v := by
  show (sum fun i => u i * (t * v i)) = t * sum fun i => u i * v i
  rw [mul_sum]
  exact sum_congr fun i => by grind

/-- `‖a + b‖² = ‖a‖² + 2⟨a, b⟩ + ‖b‖²`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem normSq_add {n : Nat} (a b : Fin n → α) :
    normSq (fun i => a i + b i) = normSq a + 2 * dot a b + normSq b := by
  show (sum fun i => (a i + b i) * (a i + b i)) =
    (sum fun i => a i * a i) + 2 * (sum fun i => a i * b i) + sum fun i => b i * b i
  have h := sum_eq_lin3 (F := fun i => (a i + b i) * (a i + b i)) 1 2 1 (fun i => a i * a i)
    (fun i => a i * b i) (fun i => b i * b i) (fun i => by grind)
  grind

/-- `‖t u‖² = t² ‖u‖²`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem normSq_smul {n : Nat} (t : α) (u : Fin n → α) :
    normSq (fun i => t * u i) = t * t * normSq u := by
  show (sum fun i => (t * u i) * (t * u i)) = t * t * sum fun i => u i * u i
  rw [mul_sum]
  exact sum_congr fun i => by grind

/-- `X (w + u) = X w + X u`. Substrate for `ridgefill.fill.predict_inputs`. -/
theorem matVec_add {m d : Nat} (X : Fin m → Fin d → α) (w u : Fin d → α) (k : Fin m) :
    matVec X (fun i => w i + u i) k = matVec X w k + matVec X u k :=
  dot_add_right (X k) w u

/-- `X (t u) = t X u`. Substrate for `ridgefill.fill.predict_inputs`. -/
theorem matVec_smul {m d : Nat} (X : Fin m → Fin d → α) (t : α) (u : Fin d → α) (k : Fin m) :
    matVec X (fun i => t * u i) k = t * matVec X u k :=
  dot_smul_right (X k) u t

/-- `X (a - b) = X a - X b`. Substrate for `ridgefill.fill.predict_inputs`. -/
theorem matVec_sub {m d : Nat} (X : Fin m → Fin d → α) (a b : Fin d → α) (k : Fin m) :
    matVec X (fun i => a i - b i) k = matVec X a k - matVec X b k := by
  show (sum fun i => X k i * (a i - b i)) = (sum fun i => X k i * a i) - sum fun i => X k i * b i
  have h := sum_lin_of (F := fun i => X k i * (a i - b i)) 1 (-1) (fun i => X k i * a i)
    (fun i => X k i * b i) (fun i => by grind)
  grind

/-- `‖a + c u‖² = ‖a‖² + 2c⟨a, u⟩ + c²‖u‖²`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem normSq_add_smul {n : Nat} (a u : Fin n → α) (c : α) :
    normSq (fun i => a i + c * u i) = normSq a + 2 * c * dot a u + c * c * normSq u := by
  show (sum fun i => (a i + c * u i) * (a i + c * u i)) =
    (sum fun i => a i * a i) + 2 * c * (sum fun i => a i * u i) + c * c * sum fun i => u i * u i
  have h := sum_eq_lin3 (F := fun i => (a i + c * u i) * (a i + c * u i)) 1 (2 * c) (c * c)
    (fun i => a i * a i) (fun i => a i * u i) (fun i => u i * u i) (fun i => by grind)
  grind

/-- `Xᵀ (a - b) = Xᵀ a - Xᵀ b`. Substrate for `ridgefill.ridge.solve_ridge`. -/
theorem matTVec_sub {m d : Nat} (X : Fin m → Fin d → α) (a b : Fin m → α) (i : Fin d) :
    matTVec X (fun k => a k - b k) i = matTVec X a i - matTVec X b i := by
  show (sum fun k => X k i * (a k - b k)) = (sum fun k => X k i * a k) - sum fun k => X k i * b k
  have h := sum_lin_of (F := fun k => X k i * (a k - b k)) 1 (-1) (fun k => X k i * a k)
    (fun k => X k i * b k) (fun k => by grind)
  grind

/-- Adjointness `⟨X u, r⟩ = ⟨u, Xᵀ r⟩`: the identity behind the normal equations
`(XᵀX + λI) w = Xᵀy + λw₀` solved by `ridgefill.ridge.solve_ridge` from `G = XᵀX`, `B = Xᵀy`. -/
theorem dot_matVec {m d : Nat} (X : Fin m → Fin d → α) (u : Fin d → α) (r : Fin m → α) :
    dot (matVec X u) r = dot u (matTVec X r) := by
  show (sum fun k => (sum fun i => X k i * u i) * r k) = sum fun i => u i * sum fun k => X k i * r k
  calc (sum fun k => (sum fun i => X k i * u i) * r k)
      = sum fun k => sum fun i => X k i * u i * r k := sum_congr fun k => sum_mul _ _
    _ = sum fun i => sum fun k => X k i * u i * r k := sum_comm _
    _ = sum fun i => u i * sum fun k => X k i * r k := sum_congr fun i => by
        rw [mul_sum]
        exact sum_congr fun k => by grind

end Lemmas

end KvaLean

end
