module

public import KvaLean.Ridge
public import KvaLean.Identity

public section

namespace KvaLean

open Lean.Grind

/-!
# Existence of the ridge solution

For `λ > 0` the normal equations `(G + λI) w = c` have exactly one solution, for a Gram matrix
`G = XᵀX` or any positive semidefinite `G`, over any linearly ordered field. The proof is
constructive Gaussian elimination: a matrix `A` with `⟨u, A u⟩ ≥ μ‖u‖²` (`μ > 0`, `A` need not be
symmetric) has a positive last pivot `a = A_{nn}`, its Schur complement
`S = B − r sᵀ / a` is again `μ`-coercive, and a solution of `S v = c' − r c_n / a` extends to
`w = (v, (c_n − s·v) / a)`. This is what `ridgefill.ridge.solve_ridge` relies on when it
factorises `G + λI` (Cholesky): the system it solves has a solution, and only one.
-/

section Defs

variable {α : Type} [Field α]

/-- `(v, t)`: the vector `v : Fin n` extended by a last entry `t`. -/
@[expose] noncomputable def extendLast {n : Nat} (v : Fin n → α) (t : α) : Fin (n + 1) → α :=
  fun k => if h : k.val < n then v ⟨k.val, h⟩ else t

/-- The Schur complement of the last diagonal entry: `S = B − r sᵀ / a` for
`A = [[B, r], [sᵀ, a]]`. -/
@[expose] noncomputable def schur {n : Nat} (A : Fin (n + 1) → Fin (n + 1) → α) : Fin n → Fin n → α :=
  fun i j => A i.castSucc j.castSucc -
    A i.castSucc (Fin.last n) * A (Fin.last n) j.castSucc / A (Fin.last n) (Fin.last n)

/-- The Gram matrix `G = XᵀX`, `G_{ij} = ∑ₖ X_{ki} X_{kj}` (the statistics' `gram` after centring). -/
@[expose] noncomputable def gram {m d : Nat} (X : Fin m → Fin d → α) : Fin d → Fin d → α :=
  fun i j => sum fun k => X k i * X k j

/-- `G + λI`, the matrix `ridgefill.ridge.solve_ridge` factorises. -/
@[expose] noncomputable def addDiag {d : Nat} (G : Fin d → Fin d → α) (lam : α) : Fin d → Fin d → α :=
  fun i j => G i j + lam * idMat i j

/-- The multi-output ridge objective with an unpenalised intercept row `b`:
`‖X W + 1 b − Y‖²_F + λ ‖W − W₀‖²_F`, what `ridgefill.ridge.fit_maps` minimises for one layer. -/
@[expose] noncomputable def ridgeObjBMulti {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) (lam : α) (W : Fin d → Fin p → α) (b : Fin p → α) : α :=
  frobSq (fun k c => matMul X W k c + b c - Y k c) + lam * frobSq (fun i c => W i c - W0 i c)

end Defs

section Elimination

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- `(v, t)` at a lifted index is `v`. Substrate for `exists_solve_of_coercive`
(`ridgefill.ridge.solve_ridge`). -/
theorem extendLast_castSucc {n : Nat} (v : Fin n → α) (t : α) (i : Fin n) :
    extendLast v t i.castSucc = v i := by
  show (if h : i.val < n then v ⟨i.val, h⟩ else t) = v i
  rw [dif_pos i.isLt]

/-- `(v, t)` at the last index is `t`. Substrate for `exists_solve_of_coercive`
(`ridgefill.ridge.solve_ridge`). -/
theorem extendLast_last {n : Nat} (v : Fin n → α) (t : α) : extendLast v t (Fin.last n) = t := by
  show (if h : n < n then v ⟨n, h⟩ else t) = t
  rw [dif_neg (Nat.lt_irrefl n)]

/-- `‖(v, t)‖² = ‖v‖² + t²`. Substrate for `exists_solve_of_coercive`
(`ridgefill.ridge.solve_ridge`). -/
theorem normSq_extendLast {n : Nat} (v : Fin n → α) (t : α) :
    normSq (extendLast v t) = normSq v + t * t := by
  have e : (sum fun i : Fin n => extendLast v t i.castSucc * extendLast v t i.castSucc) =
      sum fun i => v i * v i := sum_congr fun i => by rw [extendLast_castSucc]
  show (sum fun i : Fin n => extendLast v t i.castSucc * extendLast v t i.castSucc) +
      extendLast v t (Fin.last n) * extendLast v t (Fin.last n) = (sum fun i => v i * v i) + t * t
  rw [e, extendLast_last]

/-- `A (v, t) = A' v + t a'` with `A'` the first `n` columns and `a'` the last one.
Substrate for `exists_solve_of_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem matVec_extendLast {m n : Nat} (A : Fin m → Fin (n + 1) → α) (v : Fin n → α) (t : α)
    (k : Fin m) :
    matVec A (extendLast v t) k = matVec (fun k j => A k j.castSucc) v k + A k (Fin.last n) * t := by
  have e : (sum fun j : Fin n => A k j.castSucc * extendLast v t j.castSucc) =
      sum fun j => A k j.castSucc * v j := sum_congr fun j => by rw [extendLast_castSucc]
  show (sum fun j : Fin n => A k j.castSucc * extendLast v t j.castSucc) +
      A k (Fin.last n) * extendLast v t (Fin.last n) = (sum fun j => A k j.castSucc * v j) + _
  rw [e, extendLast_last]

/-- The quadratic form at `(v, t)`: `⟨(v,t), A (v,t)⟩ = ⟨v, B v⟩ + t⟨v, r⟩ + t⟨s, v⟩ + a t²` for
`A = [[B, r], [sᵀ, a]]`. Substrate for `schur_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem quad_extendLast {n : Nat} (A : Fin (n + 1) → Fin (n + 1) → α) (v : Fin n → α) (t : α) :
    dot (extendLast v t) (matVec A (extendLast v t)) =
      dot v (matVec (fun i j => A i.castSucc j.castSucc) v) +
        t * dot v (fun i => A i.castSucc (Fin.last n)) +
        t * dot (fun j => A (Fin.last n) j.castSucc) v +
        A (Fin.last n) (Fin.last n) * t * t := by
  have e1 : (sum fun i : Fin n => extendLast v t i.castSucc * matVec A (extendLast v t) i.castSucc) =
      sum fun i => 1 * (v i * matVec (fun i j => A i.castSucc j.castSucc) v i) +
        t * (v i * A i.castSucc (Fin.last n)) :=
    sum_congr fun i => by
      rw [extendLast_castSucc, matVec_extendLast]
      have e : matVec (fun k j => A k j.castSucc) v i.castSucc =
          matVec (fun i j => A i.castSucc j.castSucc) v i := rfl
      rw [e]
      grind
  have e2 := sum_lin 1 t (fun i => v i * matVec (fun i j => A i.castSucc j.castSucc) v i)
    (fun i => v i * A i.castSucc (Fin.last n))
  have e3 : matVec A (extendLast v t) (Fin.last n) =
      dot (fun j => A (Fin.last n) j.castSucc) v + A (Fin.last n) (Fin.last n) * t :=
    matVec_extendLast A v t (Fin.last n)
  show (sum fun i : Fin n => extendLast v t i.castSucc * matVec A (extendLast v t) i.castSucc) +
      extendLast v t (Fin.last n) * matVec A (extendLast v t) (Fin.last n) = _
  rw [e1, e2, e3, extendLast_last]
  have e4 : dot v (matVec (fun i j => A i.castSucc j.castSucc) v) =
      sum fun i => v i * matVec (fun i j => A i.castSucc j.castSucc) v i := rfl
  have e5 : dot v (fun i => A i.castSucc (Fin.last n)) =
      sum fun i => v i * A i.castSucc (Fin.last n) := rfl
  rw [e4, e5]
  grind

/-- `S v = B v − r ⟨s, v⟩ / a` for the Schur complement `S = B − r sᵀ / a`. Substrate for
`exists_solve_of_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem matVec_schur {n : Nat} (A : Fin (n + 1) → Fin (n + 1) → α) (v : Fin n → α) (i : Fin n) :
    matVec (schur A) v i =
      matVec (fun i j => A i.castSucc j.castSucc) v i -
        A i.castSucc (Fin.last n) * dot (fun j => A (Fin.last n) j.castSucc) v /
          A (Fin.last n) (Fin.last n) := by
  have h := sum_lin_of (F := fun j => schur A i j * v j) 1
    (-(A i.castSucc (Fin.last n) / A (Fin.last n) (Fin.last n)))
    (fun j => A i.castSucc j.castSucc * v j) (fun j => A (Fin.last n) j.castSucc * v j)
    (fun j => by
      show (A i.castSucc j.castSucc -
        A i.castSucc (Fin.last n) * A (Fin.last n) j.castSucc / A (Fin.last n) (Fin.last n)) * v j = _
      grind)
  show (sum fun j => schur A i j * v j) =
    (sum fun j => A i.castSucc j.castSucc * v j) -
      A i.castSucc (Fin.last n) * (sum fun j => A (Fin.last n) j.castSucc * v j) /
        A (Fin.last n) (Fin.last n)
  rw [h]
  grind

/-- The Schur complement's quadratic form: `⟨v, S v⟩ = ⟨v, B v⟩ − ⟨v, r⟩⟨s, v⟩ / a`.
Substrate for `schur_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem quad_schur {n : Nat} (A : Fin (n + 1) → Fin (n + 1) → α) (v : Fin n → α) :
    dot v (matVec (schur A) v) =
      dot v (matVec (fun i j => A i.castSucc j.castSucc) v) -
        dot v (fun i => A i.castSucc (Fin.last n)) * dot (fun j => A (Fin.last n) j.castSucc) v /
          A (Fin.last n) (Fin.last n) := by
  have h := sum_lin_of (F := fun i => v i * matVec (schur A) v i) 1
    (-(dot (fun j => A (Fin.last n) j.castSucc) v / A (Fin.last n) (Fin.last n)))
    (fun i => v i * matVec (fun i j => A i.castSucc j.castSucc) v i)
    (fun i => v i * A i.castSucc (Fin.last n))
    (fun i => by
      have h := matVec_schur A v i
      grind)
  show (sum fun i => v i * matVec (schur A) v i) =
    (sum fun i => v i * matVec (fun i j => A i.castSucc j.castSucc) v i) -
      (sum fun i => v i * A i.castSucc (Fin.last n)) * dot (fun j => A (Fin.last n) j.castSucc) v /
        A (Fin.last n) (Fin.last n)
  rw [h]
  grind

/-- `⟨0, u⟩ = 0`. Substrate for `exists_solve_of_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem dot_zero_vec_left {n : Nat} (u : Fin n → α) : dot (fun _ => (0 : α)) u = 0 :=
  dot_zero_left (fun _ => rfl) u

/-- A `μ`-coercive matrix (`⟨u, A u⟩ ≥ μ‖u‖²`, `μ > 0`) has a positive last pivot,
`A_{nn} ≥ μ > 0`. Substrate for `exists_solve_of_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem coercive_last_pos {n : Nat} {μ : α} (hμ : 0 < μ) (A : Fin (n + 1) → Fin (n + 1) → α)
    (hA : ∀ u, μ * normSq u ≤ dot u (matVec A u)) : 0 < A (Fin.last n) (Fin.last n) := by
  have h := hA (extendLast (fun _ => 0) 1)
  rw [normSq_extendLast, quad_extendLast] at h
  have z1 : normSq (fun _ : Fin n => (0 : α)) = 0 := dot_zero_vec_left _
  have z2 := dot_zero_vec_left (matVec (fun i j => A i.castSucc j.castSucc) (fun _ : Fin n => (0 : α)))
  have z3 := dot_zero_vec_left (fun i : Fin n => A i.castSucc (Fin.last n))
  have z4 : dot (fun j : Fin n => A (Fin.last n) j.castSucc) (fun _ => (0 : α)) = 0 := by
    rw [dot_comm]
    exact dot_zero_vec_left _
  rw [z1, z2, z3, z4] at h
  grind

/-- If `a > 0` and `0 ≤ D a` then `0 ≤ D`. Substrate for `schur_coercive`
(`ridgefill.ridge.solve_ridge`). -/
theorem nonneg_of_mul_pos_right {D a : α} (ha : 0 < a) (h : 0 ≤ D * a) : 0 ≤ D := by
  apply Classical.byContradiction
  intro hneg
  have h1 : D < 0 := by grind
  have h2 := OrderedRing.mul_neg_of_neg_of_pos h1 ha
  grind

/-- **`schur_coercive`**: the Schur complement of a `μ`-coercive matrix is `μ`-coercive:
`⟨v, S v⟩ ≥ μ‖v‖²`. The induction step of `exists_solve_of_coercive`: Gaussian elimination
on `G + λI` in `ridgefill.ridge.solve_ridge` never meets a zero pivot. -/
theorem schur_coercive {n : Nat} {μ : α} (hμ : 0 < μ) (A : Fin (n + 1) → Fin (n + 1) → α)
    (hA : ∀ u, μ * normSq u ≤ dot u (matVec A u)) (v : Fin n → α) :
    μ * normSq v ≤ dot v (matVec (schur A) v) := by
  have ha := coercive_last_pos hμ A hA
  rw [quad_schur]
  obtain ⟨p, hp⟩ : ∃ p, p = dot v (fun i => A i.castSucc (Fin.last n)) := ⟨_, rfl⟩
  obtain ⟨q, hq⟩ : ∃ q, q = dot (fun j => A (Fin.last n) j.castSucc) v := ⟨_, rfl⟩
  obtain ⟨Q, hQ⟩ : ∃ Q, Q = dot v (matVec (fun i j => A i.castSucc j.castSucc) v) := ⟨_, rfl⟩
  obtain ⟨a, hae⟩ : ∃ a, a = A (Fin.last n) (Fin.last n) := ⟨_, rfl⟩
  rw [← hp, ← hq, ← hQ, ← hae]
  rw [← hae] at ha
  have ha0 : a ≠ 0 := by grind
  obtain ⟨t, ht⟩ : ∃ t : α, t = -(p + q) / (2 * a) := ⟨_, rfl⟩
  have h2a : 0 < 2 * a := by grind
  have hpq : p + q = -(t * (2 * a)) := by rw [ht]; grind
  have H := hA (extendLast v t)
  rw [normSq_extendLast, quad_extendLast, ← hp, ← hq, ← hQ, ← hae] at H
  have htt : t * (p + q) = -(2 * a * (t * t)) := by rw [hpq]; grind
  have e1 : (p + q) * (p + q) = 4 * (a * a * (t * t)) := by rw [hpq]; grind
  have e3 : p * q / a * a = p * q := by grind
  have hsq := mul_self_nonneg (p - q)
  have hD : 0 ≤ (a * (t * t) - p * q / a) * a := by
    have e4 : (a * (t * t) - p * q / a) * a * 4 = (p - q) * (p - q) := by grind
    grind
  have hD' := nonneg_of_mul_pos_right ha hD
  have hμtt := OrderedRing.mul_nonneg (Std.le_of_lt hμ) (mul_self_nonneg t)
  grind

/-- **`exists_solve_of_coercive`**: a `μ`-coercive matrix (`⟨u, A u⟩ ≥ μ‖u‖²` for all `u`,
`μ > 0`; `A` need not be symmetric) is onto: for every `c` there is `w` with `A w = c`. Proved by
Gaussian elimination on the last pivot (`schur_coercive`), so the solution is constructed, not
assumed. Constrains `ridgefill.ridge.solve_ridge` (with `A = G + λI`, `μ = λ`). -/
theorem exists_solve_of_coercive : ∀ {n : Nat} (A : Fin n → Fin n → α) {μ : α}, 0 < μ →
    (∀ u, μ * normSq u ≤ dot u (matVec A u)) → ∀ c : Fin n → α, ∃ w, ∀ i, matVec A w i = c i
  | 0, _, _, _, _, _ => ⟨fun i => i.elim0, fun i => i.elim0⟩
  | n + 1, A, μ, hμ, hA, c => by
    have ha := coercive_last_pos hμ A hA
    have ha0 : A (Fin.last n) (Fin.last n) ≠ 0 := by grind
    obtain ⟨v, hv⟩ := exists_solve_of_coercive (schur A) hμ (schur_coercive hμ A hA)
      (fun i => c i.castSucc - A i.castSucc (Fin.last n) * c (Fin.last n) / A (Fin.last n) (Fin.last n))
    refine ⟨extendLast v ((c (Fin.last n) - dot (fun j => A (Fin.last n) j.castSucc) v) /
      A (Fin.last n) (Fin.last n)), fun k => ?_⟩
    rw [matVec_extendLast]
    rcases fin_cases_last k with ⟨i, rfl⟩ | rfl
    · have e : matVec (fun k j => A k j.castSucc) v i.castSucc =
          matVec (fun i j => A i.castSucc j.castSucc) v i := rfl
      have h1 := hv i
      rw [matVec_schur] at h1
      rw [e]
      grind
    · have e : matVec (fun k j => A k j.castSucc) v (Fin.last n) =
          dot (fun j => A (Fin.last n) j.castSucc) v := rfl
      rw [e]
      grind

/-- A `μ`-coercive matrix has a trivial kernel: `A e = 0` implies `e = 0`. Substrate for
`solve_unique_of_coercive` (`ridgefill.ridge.solve_ridge`). -/
theorem normSq_zero_of_coercive {n : Nat} {μ : α} (hμ : 0 < μ) (A : Fin n → Fin n → α)
    (hA : ∀ u, μ * normSq u ≤ dot u (matVec A u)) {e : Fin n → α} (he : ∀ i, matVec A e i = 0) :
    ∀ i, e i = 0 := by
  have h := hA e
  have z : dot e (matVec A e) = 0 := by
    rw [dot_comm]
    exact dot_zero_left he e
  rw [z] at h
  have hN := normSq_nonneg e
  have hN0 : normSq e = 0 := by
    apply Classical.byContradiction
    intro hne
    have hpos : 0 < normSq e := by grind
    have := OrderedRing.mul_pos hμ hpos
    grind
  exact (normSq_eq_zero_iff e).mp hN0

/-- **`solve_unique_of_coercive`**: a `μ`-coercive matrix is one-to-one: `A w₁ = A w₂` implies
`w₁ = w₂`. With `exists_solve_of_coercive`, `A` is invertible. Constrains
`ridgefill.ridge.solve_ridge`: the solution of `(G + λI) W = B + λW₀` does not depend on the
solver. -/
theorem solve_unique_of_coercive {n : Nat} {μ : α} (hμ : 0 < μ) (A : Fin n → Fin n → α)
    (hA : ∀ u, μ * normSq u ≤ dot u (matVec A u)) {w₁ w₂ : Fin n → α}
    (h : ∀ i, matVec A w₁ i = matVec A w₂ i) : w₁ = w₂ := by
  have hz := normSq_zero_of_coercive hμ A hA (e := fun i => w₁ i - w₂ i) (fun i => by
    rw [matVec_sub, h i]
    grind)
  funext i
  have := hz i
  grind

/-- **`exists_inverse_of_coercive`**: a `μ`-coercive matrix has an inverse `M`:
`A M = I`, and `M A = I`. Constrains `ridgefill.ridge.solve_ridge` (`(G + λI)⁻¹`). -/
theorem exists_inverse_of_coercive {n : Nat} {μ : α} (hμ : 0 < μ) (A : Fin n → Fin n → α)
    (hA : ∀ u, μ * normSq u ≤ dot u (matVec A u)) :
    ∃ M : Fin n → Fin n → α, matMul A M = idMat ∧ matMul M A = idMat := by
  have hex : ∀ c : Fin n, ∃ w : Fin n → α, ∀ i, matVec A w i = idMat i c :=
    fun c => exists_solve_of_coercive A hμ hA (fun i => idMat i c)
  refine ⟨fun i c => Classical.choose (hex c) i, ?_, ?_⟩
  · funext i c
    exact Classical.choose_spec (hex c) i
  · -- `A (M A e_c) = (A M) A e_c = A e_c`, so `M A e_c = e_c` by injectivity.
    funext i c
    have hAM : ∀ i c, (sum fun j => A i j * Classical.choose (hex c) j) = idMat i c :=
      fun i c => Classical.choose_spec (hex c) i
    have hcol : (fun j => sum fun k => Classical.choose (hex k) j * A k c) = fun j => idMat j c := by
      apply solve_unique_of_coercive hμ A hA
      intro r
      show (sum fun j => A r j * sum fun k => Classical.choose (hex k) j * A k c) =
        sum fun j => A r j * idMat j c
      calc (sum fun j => A r j * sum fun k => Classical.choose (hex k) j * A k c)
          = sum fun j => sum fun k => A r j * Classical.choose (hex k) j * A k c :=
            sum_congr fun j => by
              rw [mul_sum]
              exact sum_congr fun k => by grind
        _ = sum fun k => sum fun j => A r j * Classical.choose (hex k) j * A k c := sum_comm _
        _ = sum fun k => idMat r k * A k c := sum_congr fun k => by
              rw [← hAM r k, sum_mul]
        _ = sum fun j => A r j * idMat j c := by
              have e1 : (sum fun k => idMat r k * A k c) = A r c := by
                have e := sum_ite_eq (fun k => A k c) r.val
                rw [dif_pos r.isLt] at e
                rw [← e]
                exact sum_congr fun k => by
                  show (if r.val = k.val then (1 : α) else 0) * A k c =
                    if k.val = r.val then A k c else 0
                  by_cases hk : r.val = k.val
                  · rw [if_pos hk, if_pos hk.symm]
                    grind
                  · rw [if_neg hk, if_neg (fun e => hk e.symm)]
                    grind
              have e2 : (sum fun j => A r j * idMat j c) = A r c := by
                have e := sum_ite_eq (fun j => A r j) c.val
                rw [dif_pos c.isLt] at e
                rw [← e]
                exact sum_congr fun j => by
                  show A r j * (if j.val = c.val then (1 : α) else 0) =
                    if j.val = c.val then A r j else 0
                  by_cases hj : j.val = c.val
                  · rw [if_pos hj, if_pos hj]
                    grind
                  · rw [if_neg hj, if_neg hj]
                    grind
              rw [e1, e2]
    exact congrFun hcol i

end Elimination

section Gram

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- `∑ⱼ [i = j] wⱼ = wᵢ`: the identity matrix applied to a vector. Substrate for
`matVec_addDiag` (`ridgefill.ridge.solve_ridge`). -/
theorem matVec_idMat {n : Nat} (w : Fin n → α) (i : Fin n) : matVec idMat w i = w i := by
  have e := sum_ite_eq w i.val
  rw [dif_pos i.isLt] at e
  show (sum fun j => idMat i j * w j) = w i
  rw [← e]
  exact sum_congr fun j => by
    show (if i.val = j.val then (1 : α) else 0) * w j = if j.val = i.val then w j else 0
    by_cases hj : i.val = j.val
    · rw [if_pos hj, if_pos hj.symm]
      grind
    · rw [if_neg hj, if_neg (fun e => hj e.symm)]
      grind

/-- `(G + λI) w = G w + λ w`. Substrate for `exists_normalEq` (`ridgefill.ridge.solve_ridge`). -/
theorem matVec_addDiag {n : Nat} (G : Fin n → Fin n → α) (lam : α) (w : Fin n → α) (i : Fin n) :
    matVec (addDiag G lam) w i = matVec G w i + lam * w i := by
  have h := sum_lin_of (F := fun j => addDiag G lam i j * w j) 1 lam (fun j => G i j * w j)
    (fun j => idMat i j * w j) (fun j => by
      show (G i j + lam * idMat i j) * w j = _
      grind)
  have e := matVec_idMat w i
  show (sum fun j => addDiag G lam i j * w j) = (sum fun j => G i j * w j) + lam * w i
  rw [h]
  have e' : (sum fun j => idMat i j * w j) = w i := e
  rw [e']
  grind

/-- `G w = Xᵀ (X w)` for the Gram matrix `G = XᵀX`. Substrate for `exists_normalEq`
(`ridgefill.ridge.solve_ridge` works from the accumulated `G`, not from the rows `X`). -/
theorem matVec_gram {m d : Nat} (X : Fin m → Fin d → α) (w : Fin d → α) (i : Fin d) :
    matVec (gram X) w i = matTVec X (matVec X w) i := by
  show (sum fun j => (sum fun k => X k i * X k j) * w j) =
    sum fun k => X k i * sum fun j => X k j * w j
  calc (sum fun j => (sum fun k => X k i * X k j) * w j)
      = sum fun j => sum fun k => X k i * X k j * w j := sum_congr fun j => sum_mul _ _
    _ = sum fun k => sum fun j => X k i * X k j * w j := sum_comm _
    _ = sum fun k => X k i * sum fun j => X k j * w j := sum_congr fun k => by
        rw [mul_sum]
        exact sum_congr fun j => by grind

/-- The Gram matrix is positive semidefinite: `⟨u, G u⟩ = ‖X u‖² ≥ 0`. Substrate for
`exists_normalEq` (`ridgefill.ridge.solve_ridge`). -/
theorem quad_gram {m d : Nat} (X : Fin m → Fin d → α) (u : Fin d → α) :
    dot u (matVec (gram X) u) = normSq (matVec X u) := by
  have e : matVec (gram X) u = matTVec X (matVec X u) := funext fun i => matVec_gram X u i
  show dot u (matVec (gram X) u) = dot (matVec X u) (matVec X u)
  rw [e, ← dot_matVec]

/-- For `G` positive semidefinite, `G + λI` is `λ`-coercive: `⟨u, (G + λI) u⟩ ≥ λ‖u‖²`.
Substrate for `exists_solve_addDiag` (`ridgefill.ridge.solve_ridge`). -/
theorem addDiag_coercive {n : Nat} (G : Fin n → Fin n → α) (hG : ∀ u, 0 ≤ dot u (matVec G u))
    (lam : α) (u : Fin n → α) : lam * normSq u ≤ dot u (matVec (addDiag G lam) u) := by
  have e : matVec (addDiag G lam) u = fun i => matVec G u i + lam * u i :=
    funext fun i => matVec_addDiag G lam u i
  rw [e, dot_comm, dot_add_smul_left]
  have h := hG u
  have h3 := dot_comm (matVec G u) u
  have e2 : dot u u = normSq u := rfl
  grind

/-- **`exists_solve_addDiag`**: for `G` positive semidefinite (`⟨u, G u⟩ ≥ 0`, e.g. a Gram matrix)
and `λ > 0`, the system `(G + λI) w = c` has exactly one solution, over any linearly ordered
field. Constrains `ridgefill.ridge.solve_ridge`, which solves `(G + λI) W = B + λW₀` from the
accumulated statistics. -/
theorem exists_solve_addDiag {n : Nat} (G : Fin n → Fin n → α) (hG : ∀ u, 0 ≤ dot u (matVec G u))
    {lam : α} (hlam : 0 < lam) (c : Fin n → α) :
    ∃ w, (∀ i, matVec G w i + lam * w i = c i) ∧
      ∀ w' : Fin n → α, (∀ i, matVec G w' i + lam * w' i = c i) → w' = w := by
  obtain ⟨w, hw⟩ := exists_solve_of_coercive (addDiag G lam) hlam (addDiag_coercive G hG lam) c
  refine ⟨w, fun i => by rw [← matVec_addDiag]; exact hw i, fun w' hw' => ?_⟩
  apply solve_unique_of_coercive hlam (addDiag G lam) (addDiag_coercive G hG lam)
  intro i
  rw [matVec_addDiag, matVec_addDiag, hw' i, ← matVec_addDiag, hw i]

/-- **`exists_normalEq`**: for `λ > 0` the ridge normal equations `(XᵀX + λI) w = Xᵀy + λw₀`
have a solution (and by `ridge_unique` only one), over any linearly ordered field. Constrains
`ridgefill.ridge.solve_ridge`: the closed form it computes exists. -/
theorem exists_normalEq {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α) (w0 : Fin d → α)
    {lam : α} (hlam : 0 < lam) : ∃ w, NormalEq X y w0 lam w := by
  obtain ⟨w, hw, _⟩ := exists_solve_addDiag (gram X) (fun u => by
      rw [quad_gram]
      exact normSq_nonneg _) hlam (fun i => matTVec X y i + lam * w0 i)
  refine ⟨w, fun i => ?_⟩
  rw [← matVec_gram]
  exact hw i

/-- **`existsUnique_normalEq`**: for `λ > 0` the ridge normal equations have exactly one solution.
Constrains `ridgefill.ridge.solve_ridge`. -/
theorem existsUnique_normalEq {m d : Nat} (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) {lam : α} (hlam : 0 < lam) :
    ∃ w, NormalEq X y w0 lam w ∧ ∀ w', NormalEq X y w0 lam w' → w' = w := by
  obtain ⟨w, hw⟩ := exists_normalEq X y w0 hlam
  exact ⟨w, hw, fun w' hw' => ridge_unique X y w0 lam hlam hw' hw⟩

/-- **`exists_normalEqMulti`**: for `λ > 0` the multi-output normal equations
`(XᵀX + λI) W = XᵀY + λW₀` have a solution `W` (unique by `ridge_multi_unique`). Constrains
`ridgefill.ridge.solve_ridge` (all output columns of one layer's map). -/
theorem exists_normalEqMulti {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) {lam : α} (hlam : 0 < lam) : ∃ W, NormalEqMulti X Y W0 lam W :=
  ⟨fun i c => Classical.choose (exists_normalEq X (col Y c) (col W0 c) hlam) i,
    fun c => Classical.choose_spec (exists_normalEq X (col Y c) (col W0 c) hlam)⟩

end Gram

section InterceptUnique

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- The intercept objective over `b` is a parabola about the fitted intercept:
`J(w, b) = J(w, ȳ − x̄·w) + m (b − (ȳ − x̄·w))²`. Substrate for `fit_maps_unique`
(`ridgefill.ridge.fit_maps`). -/
theorem ridgeObjB_eq_add {m d : Nat} (hm : 0 < m) (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) (lam : α) (w : Fin d → α) (b : α) :
    ridgeObjB X y w0 lam w b = ridgeObjB X y w0 lam w (interceptOf X y w) +
      card m * ((b - interceptOf X y w) * (b - interceptOf X y w)) := by
  have hmpos := card_pos (α := α) hm
  have hm' : (card m : α) ≠ 0 := by grind
  have hsum := sum_residual_eq hm X y w
  have hshift := sum_sq_shift hm (fun k => matVec X w k - y k) b
  have hb : -(sum (fun k => matVec X w k - y k) / card m) = interceptOf X y w := by
    rw [hsum]
    grind
  have hb2 : b + sum (fun k => matVec X w k - y k) / card m = b - interceptOf X y w := by
    rw [← hb]
    grind
  rw [hb, hb2] at hshift
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
  rw [e1, e2, hshift]
  grind

/-- **`fit_maps_unique`**: for `λ > 0` and `m > 0` rows, the minimiser of the intercept ridge
objective `∑ₖ (Xₖ·w + b − yₖ)² + λ‖w − w₀‖²` over `(w, b)` is unique: any minimiser is
`(w★, ȳ − x̄·w★)` with `w★` the solution of the centred normal equations. Constrains
`ridgefill.ridge.fit_maps` (one output column). -/
theorem fit_maps_unique {m d : Nat} (hm : 0 < m) (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) {lam : α} (hlam : 0 < lam) {wstar : Fin d → α}
    (hN : NormalEq (centre X) (centreVec y) w0 lam wstar) {w : Fin d → α} {b : α}
    (hmin : ∀ (w' : Fin d → α) (b' : α), ridgeObjB X y w0 lam w b ≤ ridgeObjB X y w0 lam w' b') :
    w = wstar ∧ b = interceptOf X y wstar := by
  have hmpos := card_pos (α := α) hm
  have hb : b = interceptOf X y w := by
    have h1 := ridgeObjB_eq_add hm X y w0 lam w b
    have h2 := hmin w (interceptOf X y w)
    have hsq := mul_self_nonneg (b - interceptOf X y w)
    have hz : (b - interceptOf X y w) * (b - interceptOf X y w) = 0 := by
      apply Classical.byContradiction
      intro hne
      have hpos : 0 < (b - interceptOf X y w) * (b - interceptOf X y w) := by grind
      have := OrderedRing.mul_pos hmpos hpos
      grind
    have := mul_self_eq_zero.mp hz
    grind
  have hw : w = wstar := by
    apply ridge_isMin_unique (centre X) (centreVec y) w0 lam hlam hN
    intro v
    rw [← interceptObj_eq_centred, ← interceptObj_eq_centred, ← hb]
    exact hmin v (interceptOf X y v)
  refine ⟨hw, ?_⟩
  rw [hb, hw]

/-- **`fit_maps_existsUnique`**: for `λ > 0` and `m > 0` rows the intercept ridge problem has
exactly one minimiser `(w, b)`. Constrains `ridgefill.ridge.fit_maps` (one output column). -/
theorem fit_maps_existsUnique {m d : Nat} (hm : 0 < m) (X : Fin m → Fin d → α) (y : Fin m → α)
    (w0 : Fin d → α) {lam : α} (hlam : 0 < lam) :
    ∃ wb : (Fin d → α) × α,
      (∀ (w' : Fin d → α) (b' : α), ridgeObjB X y w0 lam wb.1 wb.2 ≤ ridgeObjB X y w0 lam w' b') ∧
      ∀ (w : Fin d → α) (b : α),
        (∀ (w' : Fin d → α) (b' : α), ridgeObjB X y w0 lam w b ≤ ridgeObjB X y w0 lam w' b') →
          w = wb.1 ∧ b = wb.2 := by
  obtain ⟨wstar, hN⟩ := exists_normalEq (centre X) (centreVec y) w0 hlam
  exact ⟨(wstar, interceptOf X y wstar),
    fun w' b' => fit_maps_optimal hm X y w0 lam (Std.le_of_lt hlam) hN w' b',
    fun w b hmin => fit_maps_unique hm X y w0 hlam hN hmin⟩

/-- The multi-output intercept objective is the sum over output columns of the one-column
objectives. Substrate for `fit_maps_multi_unique` (`ridgefill.ridge.fit_maps`). -/
theorem ridgeObjBMulti_eq_sum {m d p : Nat} (X : Fin m → Fin d → α) (Y : Fin m → Fin p → α)
    (W0 : Fin d → Fin p → α) (lam : α) (W : Fin d → Fin p → α) (b : Fin p → α) :
    ridgeObjBMulti X Y W0 lam W b =
      sum fun c => ridgeObjB X (col Y c) (col W0 c) lam (col W c) (b c) := by
  have h1 : frobSq (fun k c => matMul X W k c + b c - Y k c) =
      sum fun c => normSq (fun k => matVec X (col W c) k + b c - col Y c k) :=
    sum_comm (fun k c => (matMul X W k c + b c - Y k c) * (matMul X W k c + b c - Y k c))
  have h2 : frobSq (fun i c => W i c - W0 i c) =
      sum fun c => normSq (fun i => col W c i - col W0 c i) :=
    sum_comm (fun i c => (W i c - W0 i c) * (W i c - W0 i c))
  have h3 := sum_lin 1 lam (fun c => normSq (fun k => matVec X (col W c) k + b c - col Y c k))
    (fun c => normSq (fun i => col W c i - col W0 c i))
  have e : ridgeObjBMulti X Y W0 lam W b =
      frobSq (fun k c => matMul X W k c + b c - Y k c) + lam * frobSq (fun i c => W i c - W0 i c) :=
    rfl
  have e2 : (sum fun c => ridgeObjB X (col Y c) (col W0 c) lam (col W c) (b c)) =
      sum fun c => 1 * normSq (fun k => matVec X (col W c) k + b c - col Y c k) +
        lam * normSq (fun i => col W c i - col W0 c i) :=
    sum_congr fun c => by
      show normSq (fun k => matVec X (col W c) k + b c - col Y c k) +
          lam * normSq (fun i => col W c i - col W0 c i) = _
      grind
  rw [e, e2, h3, h1, h2]
  grind

/-- **`fit_maps_multi_optimal`**: for `λ ≥ 0` and `m > 0` rows, `W★` solving the centred
multi-output normal equations `(X̃ᵀX̃ + λI) W = X̃ᵀỸ + λW₀` with the intercept row
`b★ = ȳ − x̄ W★` (`interceptMulti`) minimises `‖X W + 1 b − Y‖²_F + λ‖W − W₀‖²_F` over all
`(W, b)`. Constrains `ridgefill.ridge.fit_maps` (one layer's map and bias). -/
theorem fit_maps_multi_optimal {m d p : Nat} (hm : 0 < m) (X : Fin m → Fin d → α)
    (Y : Fin m → Fin p → α) (W0 : Fin d → Fin p → α) {lam : α} (hlam : 0 ≤ lam)
    {Wstar : Fin d → Fin p → α} (hN : NormalEqMulti (centre X) (centre Y) W0 lam Wstar)
    (W : Fin d → Fin p → α) (b : Fin p → α) :
    ridgeObjBMulti X Y W0 lam Wstar (interceptMulti X Y Wstar) ≤ ridgeObjBMulti X Y W0 lam W b := by
  rw [ridgeObjBMulti_eq_sum, ridgeObjBMulti_eq_sum]
  exact sum_le_sum fun c => fit_maps_optimal hm X (col Y c) (col W0 c) lam hlam (hN c) (col W c) (b c)

/-- **`fit_maps_multi_unique`**: for `λ > 0` and `m > 0` rows, any minimiser `(W, b)` of the
multi-output intercept objective is `(W★, ȳ − x̄ W★)`: the map and bias that
`ridgefill.ridge.fit_maps` returns for a layer are the only optimum. -/
theorem fit_maps_multi_unique {m d p : Nat} (hm : 0 < m) (X : Fin m → Fin d → α)
    (Y : Fin m → Fin p → α) (W0 : Fin d → Fin p → α) {lam : α} (hlam : 0 < lam)
    {Wstar : Fin d → Fin p → α} (hN : NormalEqMulti (centre X) (centre Y) W0 lam Wstar)
    {W : Fin d → Fin p → α} {b : Fin p → α}
    (hmin : ∀ V e, ridgeObjBMulti X Y W0 lam W b ≤ ridgeObjBMulti X Y W0 lam V e) :
    W = Wstar ∧ b = interceptMulti X Y Wstar := by
  have hopt : ∀ c w' b', ridgeObjB X (col Y c) (col W0 c) lam (col Wstar c) (interceptMulti X Y Wstar c) ≤
      ridgeObjB X (col Y c) (col W0 c) lam w' b' :=
    fun c w' b' => fit_maps_optimal hm X (col Y c) (col W0 c) lam (Std.le_of_lt hlam) (hN c) w' b'
  have hle := hmin Wstar (interceptMulti X Y Wstar)
  rw [ridgeObjBMulti_eq_sum, ridgeObjBMulti_eq_sum] at hle
  have hdiff := sum_lin_of
    (F := fun c => ridgeObjB X (col Y c) (col W0 c) lam (col W c) (b c) -
      ridgeObjB X (col Y c) (col W0 c) lam (col Wstar c) (interceptMulti X Y Wstar c)) 1 (-1)
    (fun c => ridgeObjB X (col Y c) (col W0 c) lam (col W c) (b c))
    (fun c => ridgeObjB X (col Y c) (col W0 c) lam (col Wstar c) (interceptMulti X Y Wstar c))
    (fun c => by grind)
  have hnn : ∀ c, 0 ≤ ridgeObjB X (col Y c) (col W0 c) lam (col W c) (b c) -
      ridgeObjB X (col Y c) (col W0 c) lam (col Wstar c) (interceptMulti X Y Wstar c) :=
    fun c => by
      have := hopt c (col W c) (b c)
      grind
  have hnn2 := sum_nonneg hnn
  have hz := (sum_eq_zero_iff_of_nonneg hnn).mp (by grind)
  have hcol : ∀ c, col W c = col Wstar c ∧ b c = interceptOf X (col Y c) (col Wstar c) := by
    intro c
    apply fit_maps_unique hm X (col Y c) (col W0 c) hlam (hN c)
    intro w' b'
    have h1 := hz c
    have h2 := hopt c w' b'
    grind
  constructor
  · funext i c
    exact congrFun (hcol c).1 i
  · funext c
    exact (hcol c).2

end InterceptUnique

section StreamingCentred

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some algebraic lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- **`sum_centred_mul_eq_shifted`** (the centred moments from shifted running sums): for `m > 0`
rows and any shifts `σ`, `τ`,
`∑ₖ (aₖ − ā)(bₖ − b̄) = ∑ₖ (aₖ − σ)(bₖ − τ) − (∑ₖ (aₖ − σ)) (∑ₖ (bₖ − τ)) / m`.
Entry by entry (`a`, `b` two coordinates of `h` or `x_l`, `σ`, `τ` the first batch's means), this is
`ridgefill.ridge.RidgeStats.centred`: the centred Gram and cross terms that `fit_maps` hands to
`solve_ridge`, computed from the sums about the shift (`gram − s sᵀ / n`). Constrains
`ridgefill.ridge.fit_maps`. -/
theorem sum_centred_mul_eq_shifted {m : Nat} (hm : 0 < m) (a b : Fin m → α) (σ τ : α) :
    (sum fun k => (a k - mean a) * (b k - mean b)) =
      (sum fun k => (a k - σ) * (b k - τ)) -
        (sum fun k => a k - σ) * (sum fun k => b k - τ) / card m := by
  have hmpos := card_pos (α := α) hm
  have hm0 : (card m : α) ≠ 0 := by grind
  have sa := sum_lin_of (F := fun k => a k - σ) 1 (-σ) a (fun _ => (1 : α)) (fun k => by grind)
  have sb := sum_lin_of (F := fun k => b k - τ) 1 (-τ) b (fun _ => (1 : α)) (fun k => by grind)
  have e1 : (card m : α) = sum fun _ : Fin m => (1 : α) := rfl
  have ma : mean a = sum a / card m := rfl
  have mb : mean b = sum b / card m := rfl
  have hshift := sum_sub_mul_sub (fun k => a k - σ) (fun k => b k - τ) (mean a - σ) (mean b - τ)
  have e2 : (sum fun k => (a k - mean a) * (b k - mean b)) =
      sum fun k => ((a k - σ) - (mean a - σ)) * ((b k - τ) - (mean b - τ)) :=
    sum_congr fun k => by grind
  rw [e2, hshift]
  rw [← e1] at sa sb
  have pa : mean a - σ = (sum fun k => a k - σ) / card m := by rw [sa, ma]; grind
  have pb : mean b - τ = (sum fun k => b k - τ) / card m := by rw [sb, mb]; grind
  rw [pa, pb]
  generalize (sum fun k => a k - σ) = A
  generalize (sum fun k => b k - τ) = B
  grind

end StreamingCentred

end KvaLean

end
