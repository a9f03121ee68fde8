module

public import KvaLean.LinAlg
public import KvaLean.Causality

public section

namespace KvaLean

open Lean.Grind

/-!
# RoPE: a position-indexed family of rotations

A head vector is split into halves `(x, y)` (the layout of `rotate_half`); block `i` is the plane of
`(xᵢ, yᵢ)`, rotated at position `p` by the angle with cosine `c i p` and sine `s i p`:
`(xᵢ, yᵢ) ↦ (xᵢ cᵢ(p) − yᵢ sᵢ(p), yᵢ cᵢ(p) + xᵢ sᵢ(p))` (`ridgefill.adapters.base.apply_rope`,
`x·cos + rotate_half(x)·sin`). The only property of the tables used is the angle-subtraction identity
`c(b − a) = c(b) c(a) + s(b) s(a)`, `s(b − a) = s(b) c(a) − c(b) s(a)`, true of `cos`/`sin` of
`p θᵢ`. From it the score of a query rotated at `p` and a key rotated at `q` is the score of the
unrotated query with the key rotated at `q − p` (`rope_score_rel`), so it depends on positions only
through `q − p` (`rope_score_shift`).
-/

section RopeDefs

variable {α : Type} [Field α]

/-- First half of RoPE at position `p` on the head vector with halves `(x, y)`:
`xᵢ c i p − yᵢ s i p`. -/
@[expose] noncomputable def ropeFst {n : Nat} (c s : Fin n → Int → α) (p : Int) (x y : Fin n → α) : Fin n → α :=
  fun i => x i * c i p - y i * s i p

/-- Second half of RoPE at position `p`: `yᵢ c i p + xᵢ s i p`. -/
@[expose] noncomputable def ropeSnd {n : Nat} (c s : Fin n → Int → α) (p : Int) (x y : Fin n → α) : Fin n → α :=
  fun i => y i * c i p + x i * s i p

/-- The attention score (before scaling) of a query with halves `(a, b)` and a key with halves
`(u, v)`: `⟨a, u⟩ + ⟨b, v⟩`. -/
@[expose] noncomputable def headScore {n : Nat} (a b u v : Fin n → α) : α := dot a u + dot b v

end RopeDefs

section Rotation

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- The identities need only the field: the statements take the ordered-field instance set of the sum
-- lemmas they use (any linearly ordered field).
set_option linter.unusedSectionVars false

/-- **`rope_score_rel`**: if the tables satisfy the angle-subtraction identities, the score of a query
rotated at `p` and a key rotated at `q` equals the score of the unrotated query and the key rotated at
`q − p`. Constrains `ridgefill.adapters.base.apply_rope` (the keys a filled row writes and the queries
of the exact rows). -/
theorem rope_score_rel {n : Nat} (c s : Fin n → Int → α)
    (hc : ∀ i a b, c i (b - a) = c i b * c i a + s i b * s i a)
    (hs : ∀ i a b, s i (b - a) = s i b * c i a - c i b * s i a)
    (p q : Int) (x y u v : Fin n → α) :
    headScore (ropeFst c s p x y) (ropeSnd c s p x y) (ropeFst c s q u v) (ropeSnd c s q u v) =
      headScore x y (ropeFst c s (q - p) u v) (ropeSnd c s (q - p) u v) := by
  unfold headScore dot
  rw [← sum_add, ← sum_add]
  apply sum_congr
  intro i
  simp only [ropeFst, ropeSnd]
  rw [hc i p q, hs i p q]
  grind

/-- **`rope_score_shift`**: the score depends on the positions only through `q − p`: moving query and
key by the same `d` leaves it unchanged. Constrains `ridgefill.adapters.base.apply_rope`: a filled
row's key written at its true position scores against every exact row's query as the exact key at
that position would. -/
theorem rope_score_shift {n : Nat} (c s : Fin n → Int → α)
    (hc : ∀ i a b, c i (b - a) = c i b * c i a + s i b * s i a)
    (hs : ∀ i a b, s i (b - a) = s i b * c i a - c i b * s i a)
    (p q d : Int) (x y u v : Fin n → α) :
    headScore (ropeFst c s (p + d) x y) (ropeSnd c s (p + d) x y)
        (ropeFst c s (q + d) u v) (ropeSnd c s (q + d) u v) =
      headScore (ropeFst c s p x y) (ropeSnd c s p x y) (ropeFst c s q u v) (ropeSnd c s q u v) := by
  rw [rope_score_rel c s hc hs (p + d) (q + d), rope_score_rel c s hc hs p q]
  have e : q + d - (p + d) = q - p := by omega
  rw [e]

end Rotation

namespace Decoder

variable {Tok State Cache K : Type} (D : Decoder Tok State Cache)

/-- **`fillCache_rope`**: when a layer's cache function is a projection `K l` followed by the rotation
at the row's position (`cache l p x = rot p (K l x)`, as RoPE on keys), every cache entry of the filled
model is that rotation at the row's own position `t`, of the projection of either the row's input or
(filled row, `l > S`) its prediction: a filled row's key goes through the same rotation as an exact
row's. Constrains `ridgefill.fill.prefill` (filled rows' keys through the adapter's `kv`, RoPE at the
row's true position). -/
theorem fillCache_rope (rot : Nat → K → Cache) (Kp : Nat → State → K)
    (hD : ∀ l p x, D.cache l p x = rot p (Kp l x)) (tok : Nat → Tok) (P : FillPlan State)
    (l t : Nat) :
    D.fillCache tok P l t = rot t (Kp l (D.fillInput tok P l t)) ∨
      (P.split < l ∧ P.filled t = true ∧
        D.fillCache tok P l t = rot t (Kp l (P.map l t (fun i => D.input tok (P.split + 1) i.val)))) := by
  by_cases hc : P.split < l ∧ P.filled t = true
  · refine Or.inr ⟨hc.1, hc.2, ?_⟩
    rw [D.fillCache_of_filled tok P l t hc.1 hc.2, hD]
  · refine Or.inl ?_
    unfold fillCache
    rw [if_neg hc, hD]

end Decoder

end KvaLean

end
