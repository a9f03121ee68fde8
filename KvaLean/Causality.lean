module

public section

namespace KvaLean

/-- An abstract causal decoder with `Tok` tokens, per-row layer states `State` and cache entries
`Cache` (keys/values, or a recurrent-state contribution). Rows are absolute positions `t : Nat`. -/
structure Decoder (Tok State Cache : Type) where
  /-- Input of layer `0` for a row, from its token. -/
  embed : Tok → State
  /-- The cache entry that layer `l` writes for the row at absolute position `p`, computed from that
  row's layer-`l` input alone and its position (norm, K/V projection, RoPE at `p`). -/
  cache : (l : Nat) → (p : Nat) → State → Cache
  /-- Layer `l` at row `t`: the row's output from its own input and the cache entries of rows
  `0, …, t` (causal attention or a recurrence). -/
  layer : (l : Nat) → (t : Nat) → State → (Fin (t + 1) → Cache) → State

/-- A fill plan: run layers `0..split` exactly; for every layer `l > split`, a `filled` row `t` only
writes its cache entry, computed from the predicted input `map l t h_S`, where `h_S i` is row `i`'s
output of layer `split` for the rows `i = 0..t`: the prediction may read the split states of the row
and of the rows before it (a causal context), never of a later row. Rows that are not filled run
every layer. -/
structure FillPlan (State : Type) where
  /-- The split layer `S`. -/
  split : Nat
  /-- Which rows are filled (the others, including every decoding step, are exact rows). -/
  filled : Nat → Bool
  /-- The predictor of layer `l`'s input at row `t` from the split states `h_S` of rows `0..t`
  (`ridgefill.fill.predict_inputs` on `ridgefill.fill.context_features`: the row's own `h_S`, and
  with context maps also the previous row's). -/
  map : (l : Nat) → (t : Nat) → (Fin (t + 1) → State) → State

namespace FillPlan

variable {State : Type}

/-- The plain maps of `ridgefill.fill.prefill`: the prediction of layer `l`'s input at row `t` reads
only the row's own split state, `f l (h_S t)` (`ridgefill.fill.context_features` without context). -/
@[expose] def ofRowMap (split : Nat) (filled : Nat → Bool) (f : Nat → State → State) :
    FillPlan State where
  split := split
  filled := filled
  map := fun l t hs => f l (hs (Fin.last t))

/-- The context maps of `ridgefill.fill.prefill`: the prediction of layer `l`'s input at row `t`
reads the row's own split state and the previous row's, `f l (h_S t) (h_S (t - 1))`, with `zero`
standing for the state before row `0` (`ridgefill.fill.context_features` puts zeros there). -/
@[expose] def ofContextMap (split : Nat) (filled : Nat → Bool) (zero : State)
    (f : Nat → State → State → State) : FillPlan State where
  split := split
  filled := filled
  map := fun l t hs => f l (hs (Fin.last t)) (if t = 0 then zero else hs ⟨t - 1, by omega⟩)

end FillPlan

namespace Decoder

variable {Tok State Cache : Type} (D : Decoder Tok State Cache)

/-- Exact model: the input of layer `l` at row `t` (`input L t` is the final output). -/
@[expose] def input (tok : Nat → Tok) : Nat → Nat → State
  | 0, t => D.embed (tok t)
  | l + 1, t => D.layer l t (input tok l t) (fun j => D.cache l j.val (input tok l j.val))

/-- Exact model: the cache entry of row `t` at layer `l`. -/
@[expose] def exactCache (tok : Nat → Tok) (l t : Nat) : Cache := D.cache l t (D.input tok l t)

/-- Filled model: the input of layer `l` at row `t`. Layer `l` attends to the mixed cache: for
`l > S` a filled row `j` contributes `cache l j (map l j h_S)` (at its own position `j`, predicted
from the split states `h_S` of rows `0..j`), every other row its own entry. -/
@[expose] def fillInput (tok : Nat → Tok) (P : FillPlan State) : Nat → Nat → State
  | 0, t => D.embed (tok t)
  | l + 1, t => D.layer l t (fillInput tok P l t) (fun j =>
      if P.split < l ∧ P.filled j.val = true then
        D.cache l j.val (P.map l j.val (fun i => D.input tok (P.split + 1) i.val))
      else D.cache l j.val (fillInput tok P l j.val))

/-- Filled model: the cache entry of row `t` at layer `l`. -/
@[expose] def fillCache (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) : Cache :=
  if P.split < l ∧ P.filled t = true then
    D.cache l t (P.map l t (fun i => D.input tok (P.split + 1) i.val))
  else D.cache l t (D.fillInput tok P l t)

/-- One step of the filled model: layer `l` at row `t` reads the filled-model cache entries of
rows `0..t`. Unfolding lemma for `ridgefill.fill.prefill`. -/
theorem fillInput_succ (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) :
    D.fillInput tok P (l + 1) t =
      D.layer l t (D.fillInput tok P l t) (fun j => D.fillCache tok P l j.val) := rfl

/-- A filled row above the split writes the cache entry of its prediction from the split states of
rows `0..t`: `fillCache l t = cache l t (map l t h_S)`. Unfolding lemma for the filled rows of
`ridgefill.fill.prefill`. -/
theorem fillCache_of_filled (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) (hl : P.split < l)
    (ht : P.filled t = true) :
    D.fillCache tok P l t = D.cache l t (P.map l t (fun i => D.input tok (P.split + 1) i.val)) := by
  unfold fillCache
  rw [if_pos (And.intro hl ht)]

/-- With the plain maps (`FillPlan.ofRowMap`) a filled row `t` above the split writes
`cache l t (f l h_S(t))`: the prediction reads the row's own split state only. Constrains
`ridgefill.fill.context_features` (no context: the row's own `h_S`) and `ridgefill.fill.prefill`. -/
theorem fillCache_ofRowMap (tok : Nat → Tok) (split : Nat) (filled : Nat → Bool)
    (f : Nat → State → State) (l t : Nat) (hl : split < l) (ht : filled t = true) :
    D.fillCache tok (FillPlan.ofRowMap split filled f) l t =
      D.cache l t (f l (D.input tok (split + 1) t)) :=
  D.fillCache_of_filled tok (FillPlan.ofRowMap split filled f) l t hl ht

/-- With the context maps (`FillPlan.ofContextMap`) a filled row `t` above the split writes
`cache l t (f l h_S(t) h_S(t − 1))` for `t ≥ 1` and `cache l 0 (f l h_S(0) zero)` for row `0`: the
prediction reads the row's own split state and the previous row's (`zero` before row `0`), both
exact (`lower_layers_exact`). Constrains `ridgefill.fill.context_features` (features
`[h_S(t), h_S(t − 1)]`, zeros before row `0`) and `ridgefill.fill.prefill` with context maps. -/
theorem fillCache_ofContextMap (tok : Nat → Tok) (split : Nat) (filled : Nat → Bool) (zero : State)
    (f : Nat → State → State → State) (l t : Nat) (hl : split < l) (ht : filled t = true) :
    D.fillCache tok (FillPlan.ofContextMap split filled zero f) l t =
      D.cache l t (f l (D.input tok (split + 1) t)
        (if t = 0 then zero else D.input tok (split + 1) (t - 1))) :=
  D.fillCache_of_filled tok (FillPlan.ofContextMap split filled zero f) l t hl ht

/-- **Causality of the exact model**: a row's layer inputs depend only on tokens `0..t`.
Constrains the `exact` mode of `ridgefill.fill.prefill`. -/
theorem input_causal (tok tok' : Nat → Tok) :
    ∀ (l t : Nat), (∀ j, j ≤ t → tok j = tok' j) → D.input tok l t = D.input tok' l t
  | 0, t, h => by
    show D.embed (tok t) = D.embed (tok' t)
    rw [h t (Nat.le_refl t)]
  | l + 1, t, h => by
    show D.layer l t (D.input tok l t) (fun j => D.cache l j.val (D.input tok l j.val)) =
      D.layer l t (D.input tok' l t) (fun j => D.cache l j.val (D.input tok' l j.val))
    have e1 := input_causal tok tok' l t h
    have e2 : (fun j : Fin (t + 1) => D.cache l j.val (D.input tok l j.val)) =
        (fun j : Fin (t + 1) => D.cache l j.val (D.input tok' l j.val)) := by
      funext j
      have hj := j.isLt
      rw [input_causal tok tok' l j.val (fun i hi => h i (by omega))]
    exact congr (congrArg (D.layer l t) e1) e2

/-- The layer-`l` inputs of rows `0..t` (for `l = S + 1`: the split states a filled row's prediction
reads) depend only on the tokens `0..t`. Substrate for `filled_causal`: a prediction from the
row's own split state and the earlier rows' (`ridgefill.fill.context_features`) stays causal in
`ridgefill.fill.prefill`. -/
theorem input_prefix_causal (tok tok' : Nat → Tok) (l t : Nat) (h : ∀ j, j ≤ t → tok j = tok' j) :
    (fun i : Fin (t + 1) => D.input tok l i.val) = (fun i : Fin (t + 1) => D.input tok' l i.val) :=
  funext fun i => D.input_causal tok tok' l i.val fun j hj =>
    h j (Nat.le_trans hj (Nat.le_of_lt_succ i.isLt))

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
      rw [fillInput_causal tok tok' P l j.val h', D.input_prefix_causal tok tok' (P.split + 1) j.val h']
    exact congr (congrArg (D.layer l t) e1) e2

/-- **`filled_causal`**: in the filled model, the cache entry and every layer input (hence the
output) of row `t` depend only on the tokens `0..t` — filling never lets a row see the future, for
any predictor that reads the split states of rows `0..t` (the plain maps, `FillPlan.ofRowMap`, and
the context maps, `FillPlan.ofContextMap`, that also read the previous row's). Constrains
`ridgefill.fill.prefill` (all modes) and `ridgefill.fill.context_features`. -/
theorem filled_causal (tok tok' : Nat → Tok) (P : FillPlan State) (l t : Nat)
    (h : ∀ j, j ≤ t → tok j = tok' j) :
    D.fillInput tok P l t = D.fillInput tok' P l t ∧ D.fillCache tok P l t = D.fillCache tok' P l t := by
  refine ⟨D.fillInput_causal tok tok' P l t h, ?_⟩
  unfold fillCache
  rw [D.fillInput_causal tok tok' P l t h, D.input_prefix_causal tok tok' (P.split + 1) t h]

/-- **`lower_layers_exact`**: layers `0..S` are exact for every row, filled or not: the inputs of
layers `0..S+1` (in particular `h_S`) and the cache entries of layers `0..S` coincide with the
exact model's. Constrains `ridgefill.fill.prefill`. -/
theorem lower_layers_exact (tok : Nat → Tok) (P : FillPlan State) :
    ∀ l, l ≤ P.split + 1 → ∀ t, D.fillInput tok P l t = D.input tok l t
  | 0, _, t => rfl
  | l + 1, hl, t => by
    rw [fillInput_succ]
    show _ = D.layer l t (D.input tok l t) (fun j => D.cache l j.val (D.input tok l j.val))
    have e1 := lower_layers_exact tok P l (by omega) t
    have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) =
        (fun j : Fin (t + 1) => D.cache l j.val (D.input tok l j.val)) := by
      funext j
      have hc : ¬ (P.split < l ∧ P.filled j.val = true) := fun hc => absurd hc.1 (by omega)
      show D.fillCache tok P l j.val = D.cache l j.val (D.input tok l j.val)
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
      D.cache l t (P.map l t (fun i => D.input tok (P.split + 1) i.val)) =
        D.cache l t (D.input tok l t)) :
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
      show _ = D.layer l t (D.input tok l t) (fun j => D.cache l j.val (D.input tok l j.val))
      have e1 := (exact_rows_exact tok P hfill l t).1
      have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) =
          (fun j : Fin (t + 1) => D.cache l j.val (D.input tok l j.val)) :=
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
      D.cache l t (P.map l t (fun i => D.input tok (P.split + 1) i.val)) =
        D.cache l t (D.input tok l t))
    (L t : Nat) : D.fillInput tok P L t = D.input tok L t :=
  (D.exact_rows_exact tok P hfill L t).1

/-- With no filled rows (`exact` mode) the filled model is the exact model. Constrains the
`exact` mode of `ridgefill.fill.prefill`. -/
theorem exact_mode (tok : Nat → Tok) (P : FillPlan State) (hnone : ∀ t, P.filled t = false)
    (l t : Nat) : D.fillInput tok P l t = D.input tok l t :=
  D.exact_row_output tok P (fun _ t _ h => by rw [hnone t] at h; exact absurd h (by decide)) l t

/-- **`reads_every_row`**: at every layer `l` and row `t` the filled model reads every earlier row:
(1) layer `l` of row `t` reads a cache entry for *every* row `j ≤ t` (none is skipped or evicted);
(2) the entry of row `t` is the layer's own cache function at the row's own position `t` (RoPE at
`t`, also for a filled row) applied either to the row's exact
layer input, or — only for a filled row above the split — to the prediction `map l t h_S`, where
`h_S` gives the filled model's own outputs of layer `S` at rows `0..t`. Which entries the prefill
keeps (sliding windows, mode `none`) is `entry` (`no_token_dropped`). Constrains
`ridgefill.fill.prefill`. -/
theorem reads_every_row (tok : Nat → Tok) (P : FillPlan State) (l t : Nat) :
    D.fillInput tok P (l + 1) t =
        D.layer l t (D.fillInput tok P l t) (fun j => D.fillCache tok P l j.val) ∧
      (D.fillCache tok P l t = D.cache l t (D.fillInput tok P l t) ∨
        (P.split < l ∧ P.filled t = true ∧
          D.fillCache tok P l t =
            D.cache l t (P.map l t (fun i => D.fillInput tok P (P.split + 1) i.val)))) := by
  refine ⟨rfl, ?_⟩
  by_cases hc : P.split < l ∧ P.filled t = true
  · refine Or.inr ⟨hc.1, hc.2, ?_⟩
    have hS : (fun i : Fin (t + 1) => D.fillInput tok P (P.split + 1) i.val) =
        (fun i : Fin (t + 1) => D.input tok (P.split + 1) i.val) :=
      funext fun i => D.lower_layers_exact tok P (P.split + 1) (Nat.le_refl _) i.val
    rw [hS]
    exact D.fillCache_of_filled tok P l t hc.1 hc.2
  · refine Or.inl ?_
    unfold fillCache
    rw [if_neg hc]

/-- The filled model at row `t` reads the plan's `filled` only at rows `0..t`: two plans with the
same split and maps that agree on which of the rows `0..t` are filled give row `t` the same layer
inputs and cache entries. Substrate for `selected_causal` (`ridgefill.fill.prefill`). -/
theorem fillInput_congr_filled (tok : Nat → Tok) (P P' : FillPlan State) (hs : P.split = P'.split)
    (hm : P.map = P'.map) :
    ∀ (l t : Nat), (∀ j, j ≤ t → P.filled j = P'.filled j) →
      D.fillInput tok P l t = D.fillInput tok P' l t ∧ D.fillCache tok P l t = D.fillCache tok P' l t
  | 0, t, h => by
    refine ⟨rfl, ?_⟩
    unfold fillCache
    have hc : ¬ (P.split < 0 ∧ P.filled t = true) := fun hc => absurd hc.1 (Nat.not_lt_zero _)
    have hc' : ¬ (P'.split < 0 ∧ P'.filled t = true) := fun hc => absurd hc.1 (Nat.not_lt_zero _)
    rw [if_neg hc, if_neg hc']
    try rfl
  | l + 1, t, h => by
    have hin : D.fillInput tok P (l + 1) t = D.fillInput tok P' (l + 1) t := by
      rw [fillInput_succ, fillInput_succ]
      have e1 := (fillInput_congr_filled tok P P' hs hm l t h).1
      have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) =
          (fun j : Fin (t + 1) => D.fillCache tok P' l j.val) := by
        funext j
        have hj := j.isLt
        exact (fillInput_congr_filled tok P P' hs hm l j.val (fun i hi => h i (by omega))).2
      exact congr (congrArg (D.layer l t) e1) e2
    refine ⟨hin, ?_⟩
    unfold fillCache
    rw [hs, hm, h t (Nat.le_refl t), hin]

/-- **`selected_causal`** (what stays causal under a prompt-dependent selection). Let the exact rows
be chosen from the whole prompt, `filled = sel tok` (the two-pass selection of
`ridgefill.select`, which scores every prompt row before the fill). *Given the selection*, row `t`
stays causal: if two prompts agree on the tokens `0..t` and the selection agrees on the rows `0..t`,
row `t` has the same layer inputs and cache entries in both. The selection itself may depend on
later tokens (`selection_not_causal`). Constrains `ridgefill.fill.prefill` with a selection. -/
theorem selected_causal (sel : (Nat → Tok) → Nat → Bool) (split : Nat)
    (map : (l : Nat) → (t : Nat) → (Fin (t + 1) → State) → State)
    (tok tok' : Nat → Tok) (l t : Nat) (htok : ∀ j, j ≤ t → tok j = tok' j)
    (hsel : ∀ j, j ≤ t → sel tok j = sel tok' j) :
    D.fillInput tok ⟨split, sel tok, map⟩ l t = D.fillInput tok' ⟨split, sel tok', map⟩ l t ∧
      D.fillCache tok ⟨split, sel tok, map⟩ l t = D.fillCache tok' ⟨split, sel tok', map⟩ l t := by
  have h1 := fillInput_congr_filled D tok ⟨split, sel tok, map⟩ ⟨split, sel tok', map⟩ rfl rfl l t hsel
  have h2 := D.filled_causal tok tok' ⟨split, sel tok', map⟩ l t htok
  exact ⟨h1.1.trans h2.1, h1.2.trans h2.2⟩

/-- A toy decoder on numbers for `selection_not_causal`: the state is a number, a row caches its
state, and each layer returns the row's own cache entry. -/
@[expose] def toy : Decoder Nat Nat Nat where
  embed := fun x => x
  cache := fun _ _ x => x
  layer := fun _ t _ c => c ⟨t, Nat.lt_succ_self t⟩

/-- The selection of `selection_not_causal`: every row is filled iff token `1` is `1`. -/
@[expose] def toySel (tok : Nat → Nat) : Nat → Bool := fun _ => decide (tok 1 = 1)

/-- **`selection_not_causal`** (what does not stay causal): when the exact set is chosen from the
whole prompt, a row's output can depend on a later token, through the choice of whether the row is
filled. In `toy`, with split `0`, a fill map predicting `0` and the selection `toySel` (fill every
row iff token `1` is `1`), two prompts that agree on token `0` give row `0` different outputs of
layer `1`. Constrains `ridgefill.fill.prefill` with a selection: `selected_causal` holds (causal
given the selection), `filled_causal` does not extend to the prompt-dependent plan. -/
theorem selection_not_causal :
    ∃ tok tok' : Nat → Nat, tok 0 = tok' 0 ∧
      toy.fillInput tok ⟨0, toySel tok, fun _ _ _ => 0⟩ 2 0 ≠
        toy.fillInput tok' ⟨0, toySel tok', fun _ _ _ => 0⟩ 2 0 :=
  ⟨fun j => if j = 1 then 1 else 5, fun _ => 5, rfl, by decide⟩

/-- Decoding a row `t` over a given cache `C` (`C l j`: the entry of row `j < t` at layer `l`, as
left by the prefill): layer `l` of row `t` reads `C l j` for the earlier rows and its own entry
`cache l t x` (at its position `t`) for itself. -/
@[expose] def decodeInput (tok : Nat → Tok) (C : Nat → Nat → Cache) (t : Nat) : Nat → State
  | 0 => D.embed (tok t)
  | l + 1 => D.layer l t (decodeInput tok C t l) (fun j =>
      if j.val < t then C l j.val else D.cache l t (decodeInput tok C t l))

/-- **`decode_eq_fill`** (decode semantics): an exact row `t` of the filled model (a prompt row kept
exact, the last prompt row, or a decoding step) is decoding over the cache the fill left for rows
`0..t−1`: `fillInput l t = decodeInput (fillCache) t l`. Together with `filled_causal`, the next
token after the prefill is what the model computes from that cache, however the rows before it were
filled. Constrains `ridgefill.fill.prefill` (the last prompt row is recomputed exactly, and decoding
continues from the returned cache). -/
theorem decode_eq_fill (tok : Nat → Tok) (P : FillPlan State) (t : Nat) (ht : P.filled t = false) :
    ∀ l, D.fillInput tok P l t = D.decodeInput tok (D.fillCache tok P) t l
  | 0 => rfl
  | l + 1 => by
    rw [fillInput_succ]
    have ih := decode_eq_fill tok P t ht l
    show _ = D.layer l t (D.decodeInput tok (D.fillCache tok P) t l) (fun j =>
      if j.val < t then D.fillCache tok P l j.val else D.cache l t (D.decodeInput tok (D.fillCache tok P) t l))
    rw [← ih]
    have e2 : (fun j : Fin (t + 1) => D.fillCache tok P l j.val) = (fun j : Fin (t + 1) =>
        if j.val < t then D.fillCache tok P l j.val else D.cache l t (D.fillInput tok P l t)) := by
      funext j
      by_cases hj : j.val < t
      · rw [if_pos hj]
      · rw [if_neg hj]
        have hjt : j.val = t := by
          have := j.isLt
          omega
        have hc : ¬ (P.split < l ∧ P.filled t = true) := fun hc => by
          rw [ht] at hc
          exact absurd hc.2 (by decide)
        rw [hjt]
        unfold fillCache
        rw [if_neg hc]
    rw [e2]

/-- Decoding over the exact cache is the exact model: `decodeInput (exactCache) t l = input l t`.
With `decode_eq_fill`, a decoding step after the fill equals the exact model's step whenever the
fill left the exact cache (`exact_rows_exact`). Constrains `ridgefill.fill.prefill`. -/
theorem decode_exact (tok : Nat → Tok) (t : Nat) :
    ∀ l, D.decodeInput tok (D.exactCache tok) t l = D.input tok l t
  | 0 => rfl
  | l + 1 => by
    have ih := decode_exact tok t l
    show D.layer l t (D.decodeInput tok (D.exactCache tok) t l) (fun j =>
        if j.val < t then D.exactCache tok l j.val else D.cache l t (D.decodeInput tok (D.exactCache tok) t l)) =
      D.layer l t (D.input tok l t) (fun j => D.cache l j.val (D.input tok l j.val))
    rw [ih]
    have e2 : (fun j : Fin (t + 1) =>
        if j.val < t then D.exactCache tok l j.val else D.cache l t (D.input tok l t)) =
        (fun j : Fin (t + 1) => D.cache l j.val (D.input tok l j.val)) := by
      funext j
      by_cases hj : j.val < t
      · exact (if_pos hj).trans rfl
      · rw [if_neg hj]
        have hjt : j.val = t := by
          have := j.isLt
          omega
        rw [hjt]
    rw [e2]


/-! ### Absent cache entries: mode `none` and sliding windows

`fillCache` gives every row an entry at every layer. The prefill keeps fewer: in mode `none` a filled
row writes no late-layer entry, and in a sliding-window layer a filled row that no exact row sees
writes none (`needed_filled_rows`). `entry` is the cache the prefill of an `N`-row prompt keeps, with
absent entries `none`; `no_token_dropped` says that in the fill modes every entry an exact row can
read is present, and `none_drops_token` that mode `none` breaks it. -/

end Decoder

/-- The prefill modes of `ridgefill.fill.prefill` other than `exact`: the fill modes `ridge`,
`centred`, `identity`, and `none` (filled rows write no late-layer cache entry). -/
inductive FillMode where
  /-- The fitted maps. -/
  | ridge
  /-- `W = I`, `b = x̄ − h̄`. -/
  | centred
  /-- `W = I`, `b = 0`. -/
  | identity
  /-- No late-layer entries for filled rows. -/
  | none

/-- Whether filled rows write late-layer cache entries in this mode (`false` for `none` only). -/
@[expose] def FillMode.fills : FillMode → Bool
  | FillMode.none => false
  | _ => true

/-- Whether row `t` attends to row `j` at layer `l`: `j ≤ t`, and, in a sliding-window layer
(`window l = w > 0`), `t − j < w`; `window l = 0` is full causal attention. The attention mask of
`ridgefill.adapters.parts` (`visible_keys`). -/
@[expose] def sees (window : Nat → Nat) (l t j : Nat) : Bool :=
  decide (j ≤ t) && (window l == 0 || decide (t - j < window l))

/-- Whether one of the rows `0..N−1` that are exact (`filled t = false`) sees row `j` at layer `l`:
the rows `needed_filled_rows` keeps in a sliding-window layer (all rows in a full one). -/
@[expose] def seenByExact (filled : Nat → Bool) (window : Nat → Nat) (l j : Nat) : Nat → Bool
  | 0 => false
  | N + 1 => seenByExact filled window l j N || (!filled N && sees window l N j)

/-- Whether the prefill of an `N`-row prompt in mode `mode` keeps a layer-`l` cache entry for row `j`:
layers `0..S` and exact rows always; a filled row in a late layer only in a fill mode and only if some
exact row sees it (`ridgefill.fill.prefill`, `needed_filled_rows`). -/
@[expose] def writes (mode : FillMode) (split : Nat) (filled : Nat → Bool) (window : Nat → Nat)
    (N l j : Nat) : Bool :=
  decide (l ≤ split) || !filled j || (mode.fills && seenByExact filled window l j N)

namespace Decoder

variable {Tok State Cache : Type} (D : Decoder Tok State Cache)

/-- The cache entry of row `j` at layer `l` that the prefill of an `N`-row prompt keeps: the filled
model's entry `fillCache` where `writes` says one is written, else absent (`none`). -/
@[expose] noncomputable def entry (tok : Nat → Tok) (mode : FillMode) (P : FillPlan State)
    (window : Nat → Nat) (N l j : Nat) : Option Cache :=
  if writes mode P.split P.filled window N l j = true then some (D.fillCache tok P l j) else none

/-- If the exact row `t < N` sees row `j` at layer `l`, some exact row among `0..N−1` sees it.
Substrate for `no_token_dropped` (`ridgefill.fill.prefill`). -/
theorem seenByExact_of (filled : Nat → Bool) (window : Nat → Nat) (l j t : Nat)
    (ht : filled t = false) (hs : sees window l t j = true) :
    ∀ N, t < N → seenByExact filled window l j N = true
  | 0, h => absurd h (Nat.not_lt_zero _)
  | N + 1, h => by
    show (seenByExact filled window l j N || (!filled N && sees window l N j)) = true
    by_cases hN : t < N
    · simp [seenByExact_of filled window l j t ht hs N hN]
    · have e : t = N := by omega
      rw [← e, ht, hs]
      simp

/-- **`no_token_dropped`**: in the fill modes (`ridge`, `centred`, `identity`), every filled row `j`
has an entry in every late layer `l > S` for every exact row `t < N` that can see it (`sees`: causal,
and within the window of a sliding-window layer), and that entry is the layer's own cache function at
`j`'s own position of the prediction `map l j h_S` (norm, K/V projection, RoPE at `j`). Mode `none`
breaks it (`none_drops_token`). Constrains `ridgefill.fill.prefill` (with the adapters'
`needed_filled_rows` in sliding-window layers). -/
theorem no_token_dropped (tok : Nat → Tok) (mode : FillMode) (hm : mode.fills = true)
    (P : FillPlan State) (window : Nat → Nat) (N l t j : Nat) (hl : P.split < l)
    (hj : P.filled j = true) (ht : t < N) (hex : P.filled t = false)
    (hs : sees window l t j = true) :
    D.entry tok mode P window N l j =
      some (D.cache l j (P.map l j (fun i => D.input tok (P.split + 1) i.val))) := by
  have hw : writes mode P.split P.filled window N l j = true := by
    unfold writes
    rw [hm, seenByExact_of P.filled window l j t hex hs N ht]
    simp
  unfold entry
  rw [if_pos hw, D.fillCache_of_filled tok P l j hl hj]

/-- In mode `none` no filled row keeps a late-layer entry: `entry = none` for every filled row `j` and
layer `l > S`, whichever exact rows see it. Constrains `ridgefill.fill.prefill` (mode `none`). -/
theorem none_entry (tok : Nat → Tok) (P : FillPlan State) (window : Nat → Nat) (N l j : Nat)
    (hl : P.split < l) (hj : P.filled j = true) :
    D.entry tok FillMode.none P window N l j = none := by
  have hw : writes FillMode.none P.split P.filled window N l j = false := by
    unfold writes
    rw [hj]
    have hd : decide (l ≤ P.split) = false := decide_eq_false (by omega)
    rw [hd]
    rfl
  unfold entry
  rw [hw]
  exact if_neg (by decide)

/-- **`none_drops_token`** (mode `none` violates `no_token_dropped`): with the toy decoder, split `0`,
row `0` filled and row `1` exact in a 2-row prompt with full attention, the exact row `1` sees row `0`
at layer `1`, yet mode `none` keeps no layer-`1` entry for row `0`. Constrains `ridgefill.fill.prefill`
(mode `none`: late layers hold the exact rows only). -/
theorem none_drops_token :
    ∃ (P : FillPlan Nat) (window : Nat → Nat) (N l t j : Nat),
      P.split < l ∧ P.filled j = true ∧ t < N ∧ P.filled t = false ∧ sees window l t j = true ∧
        toy.entry (fun k => k) FillMode.none P window N l j = none :=
  ⟨⟨0, fun k => decide (k = 0), fun _ _ _ => 0⟩, fun _ => 0, 2, 1, 1, 0,
    by decide, by decide, by decide, by decide, by decide,
    toy.none_entry (fun k => k) ⟨0, fun k => decide (k = 0), fun _ _ _ => 0⟩ (fun _ => 0) 2 1 0
      (by decide) (by decide)⟩

end Decoder

end KvaLean

end
