module

public import KvaLean.LinAlg
public import KvaLean.Causality

public section

namespace KvaLean

open Lean.Grind

/-!
# How fill errors propagate

`exact_rows_exact` assumes a perfect fill. Here the fill may err: with distances `dS` on layer
states and `dC` on cache entries (valued in a linearly ordered field), Lipschitz cache maps
(`dC(cache_p x, cache_p y) ≤ K_c dS(x, y)` at every position `p`), Lipschitz layers (`dS(layer x c, layer y c') ≤
K_x dS(x, y) + K_a e` when every pair of cache entries is within `e`) and fill errors at most `δ`
(`dS(x̂_l, x_l) ≤ δ` for every filled row and layer `l > S`, whatever causal context the prediction
`x̂_l` reads), every layer input and cache entry of the filled model is within an explicit bound of
the exact model's, growing with depth like `(K_x + K_a K_c)^l` and linear in `δ`.
-/

/-- The error bound of `Decoder.fill_err_le`: `B₀ = 0`, `B_{l+1} = K_x B_l + K_a K_c (B_l + δ)`. -/
@[expose] noncomputable def errBound {α : Type} [Field α] (Kx Ka Kc δ : α) : Nat → α
  | 0 => 0
  | l + 1 => Kx * errBound Kx Ka Kc δ l + Ka * (Kc * (errBound Kx Ka Kc δ l + δ))

namespace Decoder

variable {α : Type} [Field α] [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α]
  [OrderedRing α]

-- Some lemmas do not need the order: keep one instance set for the whole file anyway.
set_option linter.unusedSectionVars false

/-- The bound is nonnegative for nonnegative constants. Substrate for `fill_err_le`
(`ridgefill.fill.prefill`). -/
theorem errBound_nonneg {Kx Ka Kc δ : α} (hx : 0 ≤ Kx) (ha : 0 ≤ Ka) (hc : 0 ≤ Kc) (hδ : 0 ≤ δ) :
    ∀ l, 0 ≤ errBound Kx Ka Kc δ l
  | 0 => by
    show (0 : α) ≤ 0
    grind
  | l + 1 => by
    have ih := errBound_nonneg hx ha hc hδ l
    have e : errBound Kx Ka Kc δ (l + 1) =
        Kx * errBound Kx Ka Kc δ l + Ka * (Kc * (errBound Kx Ka Kc δ l + δ)) := rfl
    have h1 := OrderedRing.mul_nonneg hx ih
    have h2 := OrderedRing.mul_nonneg hc (show 0 ≤ errBound Kx Ka Kc δ l + δ by grind)
    have h3 := OrderedRing.mul_nonneg ha h2
    rw [e]
    grind

/-- The cache-entry half of `fill_err_le`: if row `t`'s layer-`l` input is within `B_l` of the
exact one, its layer-`l` cache entry is within `K_c (B_l + δ)` (an exact row through the cache map,
a filled row through its fill error). Substrate for `fill_err_le` (`ridgefill.fill.prefill`). -/
theorem fillCache_err_le_of {Tok State Cache : Type} (D : Decoder Tok State Cache) (tok : Nat → Tok)
    (P : FillPlan State) (dS : State → State → α) (dC : Cache → Cache → α) {Kx Ka Kc δ : α}
    (hx : 0 ≤ Kx) (ha : 0 ≤ Ka) (hc : 0 ≤ Kc) (hδ : 0 ≤ δ)
    (hcache : ∀ l p x y, dC (D.cache l p x) (D.cache l p y) ≤ Kc * dS x y)
    (hfill : ∀ l t, P.split < l → P.filled t = true →
      dS (P.map l t (fun i => D.input tok (P.split + 1) i.val)) (D.input tok l t) ≤ δ)
    (l t : Nat) (hin : dS (D.fillInput tok P l t) (D.input tok l t) ≤ errBound Kx Ka Kc δ l) :
    dC (D.fillCache tok P l t) (D.exactCache tok l t) ≤ Kc * (errBound Kx Ka Kc δ l + δ) := by
  have hB := errBound_nonneg hx ha hc hδ l
  have hcB := OrderedRing.mul_nonneg hc hB
  have hcδ := OrderedRing.mul_nonneg hc hδ
  unfold fillCache exactCache
  by_cases hf : P.split < l ∧ P.filled t = true
  · rw [if_pos hf]
    have h1 := hcache l t (P.map l t (fun i => D.input tok (P.split + 1) i.val)) (D.input tok l t)
    have h2 := OrderedRing.mul_le_mul_of_nonneg_left (hfill l t hf.1 hf.2) hc
    grind
  · rw [if_neg hf]
    have h1 := hcache l t (D.fillInput tok P l t) (D.input tok l t)
    have h2 := OrderedRing.mul_le_mul_of_nonneg_left hin hc
    grind

/-- **`fill_err_le`** (a quantitative version of `exact_rows_exact`): with Lipschitz cache maps
(constant `K_c`) and layers (`K_x` in the row's input, `K_a` in the cache entries it reads), and
every filled row's predicted input `x̂_l = map l t h_S` (from the split states of rows `0..t`: the
row's own, and with context maps the previous row's) within `δ` of its exact layer input `x_l` at
every layer `l > S`, every layer input of the filled model is within `B_l` of the exact model's and
every cache entry within `K_c (B_l + δ)`, where `B₀ = 0`, `B_{l+1} = K_x B_l + K_a K_c (B_l + δ)`
(`errBound`). In particular every exact row's output (a kept prompt row, the last row, a decoding
step) is within `B_L`, and `δ = 0` gives `B_l = 0`. Constrains `ridgefill.fill.prefill`: the
exact rows' error is controlled by the fill errors `‖x̂_l − x_l‖`. -/
theorem fill_err_le {Tok State Cache : Type} (D : Decoder Tok State Cache) (tok : Nat → Tok)
    (P : FillPlan State) (dS : State → State → α) (dC : Cache → Cache → α) {Kx Ka Kc δ : α}
    (hx : 0 ≤ Kx) (ha : 0 ≤ Ka) (hc : 0 ≤ Kc) (hδ : 0 ≤ δ) (hself : ∀ x, dS x x = 0)
    (hcache : ∀ l p x y, dC (D.cache l p x) (D.cache l p y) ≤ Kc * dS x y)
    (hlayer : ∀ l t x y (c c' : Fin (t + 1) → Cache) (e : α), (∀ j, dC (c j) (c' j) ≤ e) →
      dS (D.layer l t x c) (D.layer l t y c') ≤ Kx * dS x y + Ka * e)
    (hfill : ∀ l t, P.split < l → P.filled t = true →
      dS (P.map l t (fun i => D.input tok (P.split + 1) i.val)) (D.input tok l t) ≤ δ) :
    ∀ l t, dS (D.fillInput tok P l t) (D.input tok l t) ≤ errBound Kx Ka Kc δ l ∧
      dC (D.fillCache tok P l t) (D.exactCache tok l t) ≤ Kc * (errBound Kx Ka Kc δ l + δ)
  | 0, t => by
    have hin : dS (D.fillInput tok P 0 t) (D.input tok 0 t) ≤ errBound Kx Ka Kc δ 0 := by
      show dS (D.embed (tok t)) (D.embed (tok t)) ≤ 0
      rw [hself]
      grind
    exact ⟨hin, D.fillCache_err_le_of tok P dS dC hx ha hc hδ hcache hfill 0 t hin⟩
  | l + 1, t => by
    have hin : dS (D.fillInput tok P (l + 1) t) (D.input tok (l + 1) t) ≤
        errBound Kx Ka Kc δ (l + 1) := by
      rw [fillInput_succ]
      show dS (D.layer l t (D.fillInput tok P l t) (fun j => D.fillCache tok P l j.val))
          (D.layer l t (D.input tok l t) (fun j => D.exactCache tok l j.val)) ≤
        Kx * errBound Kx Ka Kc δ l + Ka * (Kc * (errBound Kx Ka Kc δ l + δ))
      have ih := (fill_err_le D tok P dS dC hx ha hc hδ hself hcache hlayer hfill l t).1
      have h1 := hlayer l t (D.fillInput tok P l t) (D.input tok l t)
        (fun j => D.fillCache tok P l j.val) (fun j => D.exactCache tok l j.val)
        (Kc * (errBound Kx Ka Kc δ l + δ))
        (fun j => (fill_err_le D tok P dS dC hx ha hc hδ hself hcache hlayer hfill l j.val).2)
      have h2 := OrderedRing.mul_le_mul_of_nonneg_left ih hx
      grind
    exact ⟨hin, D.fillCache_err_le_of tok P dS dC hx ha hc hδ hcache hfill (l + 1) t hin⟩

/-- With exact fills (`δ = 0`) the bound vanishes at every layer: `B_l = 0`. Constrains
`ridgefill.fill.prefill` (recovers `exact_rows_exact` in distance). -/
theorem errBound_zero (Kx Ka Kc : α) : ∀ l, errBound Kx Ka Kc 0 l = 0
  | 0 => rfl
  | l + 1 => by
    have ih := errBound_zero Kx Ka Kc l
    have e : errBound Kx Ka Kc 0 (l + 1) =
        Kx * errBound Kx Ka Kc 0 l + Ka * (Kc * (errBound Kx Ka Kc 0 l + 0)) := rfl
    rw [e, ih]
    grind

end Decoder

end KvaLean

end
