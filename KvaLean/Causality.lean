module

public section

namespace KvaLean

/-- An abstract causal decoder with `Tok` tokens, per-row layer states `State` and cache entries
`Cache` (keys/values, or a recurrent-state contribution). Rows are absolute positions `t : Nat`. -/
structure Decoder (Tok State Cache : Type) where
  /-- Input of layer `0` for a row, from its token. -/
  embed : Tok → State
  /-- The cache entry that layer `l` writes for a row, computed from that row's layer-`l` input
  alone (norm, K/V projection, RoPE at the row's position). -/
  cache : Nat → State → Cache
  /-- Layer `l` at row `t`: the row's output from its own input and the cache entries of rows
  `0, …, t` (causal attention or a recurrence). -/
  layer : (l : Nat) → (t : Nat) → State → (Fin (t + 1) → Cache) → State

/-- A fill plan: run layers `0..split` exactly; for every layer `l > split`, a `filled` row only
writes its cache entry, computed from the predicted input `map l h_S` (`h_S` = the row's output of
layer `split`). Rows that are not filled run every layer. -/
structure FillPlan (State : Type) where
  /-- The split layer `S`. -/
  split : Nat
  /-- Which rows are filled (the others, including every decoding step, are exact rows). -/
  filled : Nat → Bool
  /-- The predictor of layer `l`'s input from `h_S` (`ridgefill.fill.predict_inputs`). -/
  map : Nat → State → State

namespace Decoder

variable {Tok State Cache : Type} (D : Decoder Tok State Cache)

/-- Exact model: the input of layer `l` at row `t` (`input L t` is the final output). -/
@[expose] def input (tok : Nat → Tok) : Nat → Nat → State
  | 0, t => D.embed (tok t)
  | l + 1, t => D.layer l t (input tok l t) (fun j => D.cache l (input tok l j.val))

/-- Exact model: the cache entry of row `t` at layer `l`. -/
@[expose] def exactCache (tok : Nat → Tok) (l t : Nat) : Cache := D.cache l (D.input tok l t)

/-- Filled model: the input of layer `l` at row `t`. Layer `l` attends to the mixed cache: for
`l > S` a filled row `j` contributes `cache l (map l h_S(j))`, every other row its own entry. -/
@[expose] def fillInput (tok : Nat → Tok) (P : FillPlan State) : Nat → Nat → State
  | 0, t => D.embed (tok t)
  | l + 1, t => D.layer l t (fillInput tok P l t) (fun j =>
      if P.split < l ∧ P.filled j.val = true then
        D.cache l (P.map l (D.input tok (P.split + 1) j.val))
      else D.cache l (fillInput tok P l j.val))

/-- Filled model: the cache entry of row `t` at layer `l`. -/
@[expose] def fillCache (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) : Cache :=
  if P.split < l ∧ P.filled t = true then D.cache l (P.map l (D.input tok (P.split + 1) t))
  else D.cache l (D.fillInput tok P l t)

/-- One step of the filled model: layer `l` at row `t` reads the filled-model cache entries of
rows `0..t`. Unfolding lemma for `ridgefill.fill.prefill`. -/
theorem fillInput_succ (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) :
    D.fillInput tok P (l + 1) t =
      D.layer l t (D.fillInput tok P l t) (fun j => D.fillCache tok P l j.val) := rfl

/-- **Causality of the exact model**: a row's layer inputs depend only on tokens `0..t`.
Constrains the `exact` mode of `ridgefill.fill.prefill`. -/
theorem input_causal (tok tok' : Nat → Tok) :
    ∀ (l t : Nat), (∀ j, j ≤ t → tok j = tok' j) → D.input tok l t = D.input tok' l t
  | 0, t, h => by
    show D.embed (tok t) = D.embed (tok' t)
    rw [h t (Nat.le_refl t)]
  | l + 1, t, h => by
    show D.layer l t (D.input tok l t) (fun j => D.cache l (D.input tok l j.val)) =
      D.layer l t (D.input tok' l t) (fun j => D.cache l (D.input tok' l j.val))
    have e1 := input_causal tok tok' l t h
    have e2 : (fun j : Fin (t + 1) => D.cache l (D.input tok l j.val)) =
        (fun j : Fin (t + 1) => D.cache l (D.input tok' l j.val)) := by
      funext j
      have hj := j.isLt
      rw [input_causal tok tok' l j.val (fun i hi => h i (by omega))]
    exact congr (congrArg (D.layer l t) e1) e2

/-- Causality of the filled model's layer inputs (helper for `filled_causal`). Constrains
`ridgefill.fill.prefill`. -/
theorem fillInput_causal (tok tok' : Nat → Tok) (P : FillPlan State) :
    ∀ (l t : Nat), (∀ j, j ≤ t → tok j = tok' j) → D.fillInput tok P l t = D.fillInput tok' P l t
  | 0, t, h => by
    show D.embed (tok t) = D.embed (tok' t)
    rw [h t (Nat.le_refl t)]
  | l + 1, t, h => by
    rw [fillInput_succ, fillInput_succ]
    have e1 := fillInput_causal tok tok' P l t h
    have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) =
        (fun j : Fin (t + 1) => D.fillCache tok' P l j.val) := by
      funext j
      have hj := j.isLt
      have h' : ∀ i, i ≤ j.val → tok i = tok' i := fun i hi => h i (by omega)
      show D.fillCache tok P l j.val = D.fillCache tok' P l j.val
      unfold fillCache
      rw [fillInput_causal tok tok' P l j.val h', D.input_causal tok tok' (P.split + 1) j.val h']
    exact congr (congrArg (D.layer l t) e1) e2

/-- **`filled_causal`**: in the filled model, the cache entry and every layer input (hence the
output) of row `t` depend only on the tokens `0..t` — filling never lets a row see the future.
Constrains `ridgefill.fill.prefill` (all modes). -/
theorem filled_causal (tok tok' : Nat → Tok) (P : FillPlan State) (l t : Nat)
    (h : ∀ j, j ≤ t → tok j = tok' j) :
    D.fillInput tok P l t = D.fillInput tok' P l t ∧ D.fillCache tok P l t = D.fillCache tok' P l t := by
  refine ⟨D.fillInput_causal tok tok' P l t h, ?_⟩
  unfold fillCache
  rw [D.fillInput_causal tok tok' P l t h, D.input_causal tok tok' (P.split + 1) t h]

/-- **`lower_layers_exact`**: layers `0..S` are exact for every row, filled or not: the inputs of
layers `0..S+1` (in particular `h_S`) and the cache entries of layers `0..S` coincide with the
exact model's. Constrains `ridgefill.fill.prefill`. -/
theorem lower_layers_exact (tok : Nat → Tok) (P : FillPlan State) :
    ∀ l, l ≤ P.split + 1 → ∀ t, D.fillInput tok P l t = D.input tok l t
  | 0, _, t => rfl
  | l + 1, hl, t => by
    rw [fillInput_succ]
    show _ = D.layer l t (D.input tok l t) (fun j => D.cache l (D.input tok l j.val))
    have e1 := lower_layers_exact tok P l (by omega) t
    have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) =
        (fun j : Fin (t + 1) => D.cache l (D.input tok l j.val)) := by
      funext j
      have hc : ¬ (P.split < l ∧ P.filled j.val = true) := fun hc => absurd hc.1 (by omega)
      show D.fillCache tok P l j.val = D.cache l (D.input tok l j.val)
      unfold fillCache
      rw [if_neg hc, lower_layers_exact tok P l (by omega) j.val]
    exact congr (congrArg (D.layer l t) e1) e2

/-- Cache entries of layers `0..S` are exact for every row (part of `lower_layers_exact`).
Constrains `ridgefill.fill.prefill`. -/
theorem lower_cache_exact (tok : Nat → Tok) (P : FillPlan State) (l t : Nat)
    (hl : l ≤ P.split) : D.fillCache tok P l t = D.exactCache tok l t := by
  have hc : ¬ (P.split < l ∧ P.filled t = true) := fun hc => absurd hc.1 (by omega)
  unfold fillCache exactCache
  rw [if_neg hc, D.lower_layers_exact tok P l (by omega) t]

/-- **`exact_rows_exact`**: if every filled row's late cache entries equal the exact ones, then
every layer input and cache entry of the filled model equals the exact model's; in particular every
exact row (every row with `filled t = false`, including every decoding step appended after the
prompt) produces exactly the exact model's output. Constrains `ridgefill.fill.prefill`: errors can
only enter through the filled rows' cache entries. -/
theorem exact_rows_exact (tok : Nat → Tok) (P : FillPlan State)
    (hfill : ∀ l t, P.split < l → P.filled t = true →
      D.cache l (P.map l (D.input tok (P.split + 1) t)) = D.cache l (D.input tok l t)) :
    ∀ l t, D.fillInput tok P l t = D.input tok l t ∧ D.fillCache tok P l t = D.exactCache tok l t
  | 0, t => by
    refine ⟨rfl, ?_⟩
    have hc : ¬ (P.split < 0 ∧ P.filled t = true) := fun hc => absurd hc.1 (Nat.not_lt_zero _)
    unfold fillCache exactCache
    rw [if_neg hc]
    try rfl
  | l + 1, t => by
    have hin : D.fillInput tok P (l + 1) t = D.input tok (l + 1) t := by
      rw [fillInput_succ]
      show _ = D.layer l t (D.input tok l t) (fun j => D.cache l (D.input tok l j.val))
      have e1 := (exact_rows_exact tok P hfill l t).1
      have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) =
          (fun j : Fin (t + 1) => D.cache l (D.input tok l j.val)) :=
        funext fun j => (exact_rows_exact tok P hfill l j.val).2
      exact congr (congrArg (D.layer l t) e1) e2
    refine ⟨hin, ?_⟩
    unfold fillCache exactCache
    by_cases hc : P.split < l + 1 ∧ P.filled t = true
    · rw [if_pos hc]
      exact hfill (l + 1) t hc.1 hc.2
    · rw [if_neg hc, hin]

/-- The exact-row corollary of `exact_rows_exact`: the final output of an exact row (a prompt row
kept exact, or a decoding step) equals the exact model's output. Constrains
`ridgefill.fill.prefill`. -/
theorem exact_row_output (tok : Nat → Tok) (P : FillPlan State)
    (hfill : ∀ l t, P.split < l → P.filled t = true →
      D.cache l (P.map l (D.input tok (P.split + 1) t)) = D.cache l (D.input tok l t))
    (L t : Nat) : D.fillInput tok P L t = D.input tok L t :=
  (D.exact_rows_exact tok P hfill L t).1

/-- With no filled rows (`exact` mode) the filled model is the exact model. Constrains the
`exact` mode of `ridgefill.fill.prefill`. -/
theorem exact_mode (tok : Nat → Tok) (P : FillPlan State) (hnone : ∀ t, P.filled t = false)
    (l t : Nat) : D.fillInput tok P l t = D.input tok l t :=
  D.exact_row_output tok P (fun _ t _ h => by rw [hnone t] at h; exact absurd h (by decide)) l t

/-- **`no_token_dropped`**: at every layer `l` and row `t` the filled model keeps the token:
(1) layer `l` of row `t` reads a cache entry for *every* row `j ≤ t` (none is skipped or evicted);
(2) the entry of row `t` is the layer's own cache function applied either to the row's exact
layer input, or — only for a filled row above the split — to the prediction `map l h_S`, where
`h_S` is the filled model's own output of layer `S`. Constrains `ridgefill.fill.prefill`. -/
theorem no_token_dropped (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) :
    D.fillInput tok P (l + 1) t =
        D.layer l t (D.fillInput tok P l t) (fun j => D.fillCache tok P l j.val) ∧
      (D.fillCache tok P l t = D.cache l (D.fillInput tok P l t) ∨
        (P.split < l ∧ P.filled t = true ∧
          D.fillCache tok P l t = D.cache l (P.map l (D.fillInput tok P (P.split + 1) t)))) := by
  refine ⟨rfl, ?_⟩
  by_cases hc : P.split < l ∧ P.filled t = true
  · refine Or.inr ⟨hc.1, hc.2, ?_⟩
    unfold fillCache
    rw [if_pos hc, D.lower_layers_exact tok P (P.split + 1) (Nat.le_refl _) t]
  · refine Or.inl ?_
    unfold fillCache
    rw [if_neg hc]

end Decoder

end KvaLean

end
