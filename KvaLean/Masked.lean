module

public import KvaLean.Causality

public section

namespace KvaLean

/-! ### A decoder that reads the cache through a visibility mask

In `Decoder` a layer gets the entries of rows `0..t` only (`Fin (t + 1) → Cache`), so causality holds by
its type, and every entry is present. Here a layer gets, for *every* row `j`, the entry the cache holds
(`some`) or nothing (`none`: absent, or past the prompt), so nothing in the type keeps it from reading a
later row or from meeting an absent entry. `MDecoder.Causal` is the property that it does not read
rows outside its mask (`sees`); `reads_later_row_not_causal` shows a decoder without it,
`decode_entry_exact` that with it decoding over the entries the prefill keeps (`writes`) is exact when
every entry an exact row sees is kept and exact, and `none_changes_exact_row` that mode `none`, which
drops entries an exact row sees, changes that row's output. -/

/-- A decoder whose layers read the cache through a visibility mask: `layer l t x kv` is layer `l` at
row `t` from the row's input `x` and, for every row `j`, the entry `kv j` the cache holds at layer `l`
(`none` if it holds none). The attention of `ridgefill.fill.prefill`'s layers, with their mask
(`ridgefill.adapters.parts.visible_keys`) inside the layer. -/
structure MDecoder (Tok State Cache : Type) where
  /-- Input of layer `0` for a row, from its token. -/
  embed : Tok → State
  /-- The cache entry that layer `l` writes for the row at position `p`, from that row's layer-`l` input. -/
  cache : (l : Nat) → (p : Nat) → State → Cache
  /-- Layer `l` at row `t`: the row's output from its own input and the cache entry (if any) of every row. -/
  layer : (l : Nat) → (t : Nat) → State → (Nat → Option Cache) → State

/-- A row sees only rows at or before it: `sees window l t j = true → j ≤ t`. Supporting lemma of
`MDecoder.input_causal` (the mask of `ridgefill.adapters.parts.visible_keys`). -/
theorem sees_le {window : Nat → Nat} {l t j : Nat} (h : sees window l t j = true) : j ≤ t := by
  unfold sees at h
  rw [Bool.and_eq_true] at h
  exact of_decide_eq_true h.1

namespace MDecoder

variable {Tok State Cache : Type} (D : MDecoder Tok State Cache)

/-- Causality through the mask: layer `l` at row `t` reads only the entries of the rows it sees
(`sees window l t j`: `j ≤ t`, and within the window of a sliding-window layer); two caches that agree
on those rows give the same output. What `ridgefill.fill.prefill`'s attention mask provides. -/
@[expose] abbrev Causal (window : Nat → Nat) : Prop :=
  ∀ (l t : Nat) (x : State) (kv kv' : Nat → Option Cache),
    (∀ j, sees window l t j = true → kv j = kv' j) → D.layer l t x kv = D.layer l t x kv'

/-- Exact model of an `N`-row prompt: the input of layer `l` at row `t` (`input N tok L t` is the
output). Layer `l` reads the entry of every prompt row, `none` past row `N − 1`. -/
@[expose] def input (N : Nat) (tok : Nat → Tok) : Nat → Nat → State
  | 0, t => D.embed (tok t)
  | l + 1, t => D.layer l t (input N tok l t)
      (fun j => if j < N then some (D.cache l j (input N tok l j)) else none)

/-- The prefill of an `N`-row prompt with plan `P` in mode `mode`: the input of layer `l` at row `t`.
Layer `l` reads, for each row `j`, the entry the prefill keeps (`entryM`): none past the prompt or where
`writes` says none is written (mode `none`; a sliding-window layer's filled rows no exact row sees);
else, for a filled row above the split, the entry of its prediction `map l j h_S`, and for every other
row its own. -/
@[expose] def fillInput (N : Nat) (tok : Nat → Tok) (mode : FillMode) (P : FillPlan State)
    (window : Nat → Nat) : Nat → Nat → State
  | 0, t => D.embed (tok t)
  | l + 1, t => D.layer l t (fillInput N tok mode P window l t) (fun j =>
      if (decide (j < N) && writes mode P.split P.filled window N l j) = true then
        some (if P.split < l ∧ P.filled j = true then
          D.cache l j (P.map l j (fun i => D.input N tok (P.split + 1) i.val))
        else D.cache l j (fillInput N tok mode P window l j))
      else none)

/-- The layer-`l` entry of row `j` that the prefill of an `N`-row prompt keeps (`none`: absent).
`ridgefill.fill.prefill`'s cache. -/
@[expose] def entryM (N : Nat) (tok : Nat → Tok) (mode : FillMode) (P : FillPlan State)
    (window : Nat → Nat) (l j : Nat) : Option Cache :=
  if (decide (j < N) && writes mode P.split P.filled window N l j) = true then
    some (if P.split < l ∧ P.filled j = true then
      D.cache l j (P.map l j (fun i => D.input N tok (P.split + 1) i.val))
    else D.cache l j (D.fillInput N tok mode P window l j))
  else none

/-- Decoding row `t` over a cache `C` (`C l j`: row `j`'s entry at layer `l`, `none` if absent): layer
`l` reads `C l j` for every other row and the row's own entry at its position `t`. -/
@[expose] def decode (tok : Nat → Tok) (C : Nat → Nat → Option Cache) (t : Nat) : Nat → State
  | 0 => D.embed (tok t)
  | l + 1 => D.layer l t (decode tok C t l)
      (fun j => if j = t then some (D.cache l t (decode tok C t l)) else C l j)

private theorem input_succ (N : Nat) (tok : Nat → Tok) (l t : Nat) :
    D.input N tok (l + 1) t = D.layer l t (D.input N tok l t)
      (fun j => if j < N then some (D.cache l j (D.input N tok l j)) else none) := rfl

private theorem fillInput_succ (N : Nat) (tok : Nat → Tok) (mode : FillMode) (P : FillPlan State)
    (window : Nat → Nat) (l t : Nat) :
    D.fillInput N tok mode P window (l + 1) t =
      D.layer l t (D.fillInput N tok mode P window l t) (D.entryM N tok mode P window l) := rfl

private theorem decode_succ (tok : Nat → Tok) (C : Nat → Nat → Option Cache) (t l : Nat) :
    D.decode tok C t (l + 1) = D.layer l t (D.decode tok C t l)
      (fun j => if j = t then some (D.cache l t (D.decode tok C t l)) else C l j) := rfl

/-- **`input_causal`** (the masked exact model is causal when its layers are): row `t`'s layer inputs
depend only on the tokens `0..t`, whatever the prompt length past `t`. Constrains
`ridgefill.fill.prefill` (`exact`). -/
theorem input_causal (window : Nat → Nat) (hc : D.Causal window) (N N' : Nat) (tok tok' : Nat → Tok) :
    ∀ (l t : Nat), t < N → t < N' → (∀ j, j ≤ t → tok j = tok' j) →
      D.input N tok l t = D.input N' tok' l t
  | 0, t, _, _, h => by
    show D.embed (tok t) = D.embed (tok' t)
    rw [h t (Nat.le_refl t)]
  | l + 1, t, hN, hN', h => by
    rw [input_succ, input_succ, input_causal window hc N N' tok tok' l t hN hN' h]
    refine hc l t _ _ _ (fun j hs => ?_)
    have hj : j ≤ t := sees_le hs
    have hjN : j < N := by omega
    have hjN' : j < N' := by omega
    rw [if_pos hjN, if_pos hjN',
      input_causal window hc N N' tok tok' l j hjN hjN' (fun i hi => h i (by omega))]

/-- The prefill's layer inputs are exact (supporting lemma of `decode_entry_exact`): if the layers are
causal through the mask, every entry an exact row sees is kept, and every kept filled entry above the
split is exact, then every row's inputs of layers `0..S+1`, and every exact row's inputs of all
layers, equal the exact model's. Constrains `ridgefill.fill.prefill`. -/
theorem fillInput_exact (window : Nat → Nat) (hc : D.Causal window) (N : Nat) (tok : Nat → Tok)
    (mode : FillMode) (P : FillPlan State)
    (hcov : ∀ l t j, t < N → P.filled t = false → sees window l t j = true →
      writes mode P.split P.filled window N l j = true)
    (hfill : ∀ l j, j < N → P.split < l → P.filled j = true →
      D.cache l j (P.map l j (fun i => D.input N tok (P.split + 1) i.val)) =
        D.cache l j (D.input N tok l j)) :
    ∀ (l j : Nat), j < N → (P.filled j = false ∨ l ≤ P.split + 1) →
      D.fillInput N tok mode P window l j = D.input N tok l j
  | 0, _, _, _ => rfl
  | l + 1, t, ht, hcase => by
    have ih := fillInput_exact window hc N tok mode P hcov hfill l
    rw [fillInput_succ, input_succ,
      ih t ht (hcase.elim Or.inl (fun h => Or.inr (by omega)))]
    refine hc l t _ _ _ (fun j hs => ?_)
    have hj : j ≤ t := sees_le hs
    have hjN : j < N := by omega
    rw [if_pos hjN]
    unfold entryM
    by_cases hl : l ≤ P.split
    · have hw : writes mode P.split P.filled window N l j = true := by
        unfold writes
        simp [hl]
      have hcond : (decide (j < N) && writes mode P.split P.filled window N l j) = true := by
        rw [hw]
        simp [hjN]
      rw [if_pos hcond, if_neg (show ¬ (P.split < l ∧ P.filled j = true) from fun h => absurd h.1 (by omega)),
        ih j hjN (Or.inr (by omega))]
    · have htx : P.filled t = false := hcase.resolve_right (by omega)
      have hw := hcov l t j ht htx hs
      have hcond : (decide (j < N) && writes mode P.split P.filled window N l j) = true := by
        rw [hw]
        simp [hjN]
      rw [if_pos hcond]
      by_cases hf : P.filled j = true
      · rw [if_pos (show P.split < l ∧ P.filled j = true from ⟨by omega, hf⟩),
          hfill l j hjN (by omega) hf]
      · have hf' : P.filled j = false := by simpa using hf
        rw [if_neg (show ¬ (P.split < l ∧ P.filled j = true) from fun h => hf h.2),
          ih j hjN (Or.inl hf')]

/-- An exact row `t` of the prefill is decoding over the entries the prefill keeps: decoding row `t`
over `entryM` gives the prefill's own layer inputs of row `t` (supporting lemma of
`decode_entry_exact`). Constrains `ridgefill.fill.prefill`. -/
theorem decode_entry (N : Nat) (tok : Nat → Tok) (mode : FillMode) (P : FillPlan State)
    (window : Nat → Nat) (t : Nat) (ht : t < N) (hex : P.filled t = false) :
    ∀ l, D.decode tok (D.entryM N tok mode P window) t l = D.fillInput N tok mode P window l t
  | 0 => rfl
  | l + 1 => by
    rw [decode_succ, fillInput_succ, decode_entry N tok mode P window t ht hex l]
    congr 1
    funext j
    by_cases hj : j = t
    · rw [if_pos hj, hj]
      have hw : writes mode P.split P.filled window N l t = true := by
        unfold writes
        simp [hex]
      have hcond : (decide (t < N) && writes mode P.split P.filled window N l t) = true := by
        rw [hw]
        simp [ht]
      unfold entryM
      rw [if_pos hcond, if_neg (show ¬ (P.split < l ∧ P.filled t = true) from fun h => by
        rw [hex] at h
        exact absurd h.2 (by decide))]
    · rw [if_neg hj]

/-- **`decode_entry_exact`** (a): if the layers read the cache only through their mask (`Causal`),
the prefill keeps an entry for every row an exact row sees (`writes`), and every kept filled entry
above the split equals the exact one, then decoding an exact row `t` over the entries the prefill keeps
gives the exact model's inputs of every layer, hence its output. Constrains `ridgefill.fill.prefill`
(the cache it returns, `entryM`, with `needed_filled_rows` in sliding-window layers). -/
theorem decode_entry_exact (window : Nat → Nat) (hc : D.Causal window) (N : Nat) (tok : Nat → Tok)
    (mode : FillMode) (P : FillPlan State)
    (hcov : ∀ l t j, t < N → P.filled t = false → sees window l t j = true →
      writes mode P.split P.filled window N l j = true)
    (hfill : ∀ l j, j < N → P.split < l → P.filled j = true →
      D.cache l j (P.map l j (fun i => D.input N tok (P.split + 1) i.val)) =
        D.cache l j (D.input N tok l j))
    (t : Nat) (ht : t < N) (hex : P.filled t = false) (l : Nat) :
    D.decode tok (D.entryM N tok mode P window) t l = D.input N tok l t := by
  rw [D.decode_entry N tok mode P window t ht hex l]
  exact D.fillInput_exact window hc N tok mode P hcov hfill l t ht (Or.inl hex)

/-- In the fill modes (`ridge`, `centred`, `identity`) the prefill keeps every entry an exact row sees:
the coverage hypothesis of `decode_entry_exact` holds. Constrains `ridgefill.fill.prefill`. -/
theorem fill_modes_cover (mode : FillMode) (hm : mode.fills = true) (split : Nat)
    (filled : Nat → Bool) (window : Nat → Nat) (N : Nat) :
    ∀ l t j, t < N → filled t = false → sees window l t j = true →
      writes mode split filled window N l j = true := by
  intro l t j ht hex hs
  unfold writes
  rw [hm, Decoder.seenByExact_of filled window l j t hex hs N ht]
  simp

/-- A layer that adds the entry of row `0` (`0` if absent) to its input: causal through the full mask.
The instance of `none_changes_exact_row`. -/
@[expose] def addFirst : MDecoder Nat Nat Nat where
  embed := fun x => x
  cache := fun _ _ x => x
  layer := fun _ _ x kv => x + (kv 0).getD 0

/-- A layer that adds the entry of the *next* row: it reads a row its mask hides. The instance of
`reads_later_row_not_causal`. -/
@[expose] def peek : MDecoder Nat Nat Nat where
  embed := fun x => x
  cache := fun _ _ x => x
  layer := fun _ t x kv => x + (kv (t + 1)).getD 0

/-- `addFirst` is causal through the full causal mask (`window = 0`). Supporting lemma of
`none_changes_exact_row`. -/
theorem addFirst_causal : addFirst.Causal (fun _ => 0) := by
  intro l t x kv kv' h
  have hs : sees (fun _ => 0) l t 0 = true := by simp [sees]
  show x + (kv 0).getD 0 = x + (kv' 0).getD 0
  rw [h 0 hs]

/-- **`none_changes_exact_row`** (b): mode `none` changes an exact row's output. With the causal
decoder `addFirst`, a 2-row prompt, split `0`, row `0` filled and row `1` exact, mode `none` keeps no
layer-`1` entry for row `0`, which row `1` sees: decoding row `1` over what the prefill keeps gives
`2` at layer `2`, the exact model `4`. Constrains `ridgefill.fill.prefill` (mode `none`). -/
theorem none_changes_exact_row :
    addFirst.Causal (fun _ => 0) ∧
      ∃ (N t : Nat) (tok : Nat → Nat) (P : FillPlan Nat), t < N ∧ P.filled t = false ∧
        addFirst.decode tok (addFirst.entryM N tok FillMode.none P (fun _ => 0)) t (P.split + 2) ≠
          addFirst.input N tok (P.split + 2) t :=
  ⟨addFirst_causal, 2, 1, fun _ => 1, ⟨0, fun j => decide (j = 0), fun _ _ _ => 0⟩,
    by decide, by decide, by decide⟩

/-- **`reads_later_row_not_causal`** (c): a decoder that reads a later row is a counterexample to
causality. `peek` is not `Causal` for the full causal mask, and two prompts that agree on token `0`
give row `0` different layer-`1` inputs. What the attention mask of `ridgefill.fill.prefill`
(`ridgefill.adapters.parts.visible_keys`) rules out. -/
theorem reads_later_row_not_causal :
    ¬ peek.Causal (fun _ => 0) ∧
      ∃ tok tok' : Nat → Nat, tok 0 = tok' 0 ∧ peek.input 2 tok 1 0 ≠ peek.input 2 tok' 1 0 := by
  refine ⟨fun h => ?_, fun _ => 0, fun j => if j = 1 then 1 else 0, rfl, by decide⟩
  have e := h 0 0 0 (fun _ => none) (fun j => if j = 1 then some 1 else none) (fun j hs => by
    have hj : j = 0 := by
      have := sees_le hs
      omega
    rw [hj]
    rfl)
  exact absurd e (by decide)

end MDecoder

end KvaLean

end
