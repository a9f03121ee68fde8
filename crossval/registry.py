"""The statement registry: every KvaLean theorem, the Python it constrains and the crossval tests that
check it.

One :class:`Entry` per public theorem of ``KvaLean/*.lean``. ``python`` names the functions whose
behaviour the theorem states (dotted paths that import); ``tests`` names the crossval tests that
check that behaviour (``<file>::<function>`` under ``crossval/``). Supporting lemmas (the linear
algebra the main theorems are proved from) state no Python behaviour of their own: their entry has
``python=()`` and lists the tests of the statements they support. ``test_registry.py`` fails when an
entry names a theorem the Lean sources lack, when a public theorem has no entry, when a Python name
or test does not exist, or when a Lean file holds ``sorry``, ``admit``, ``native_decide`` or an axiom.

When a Python function changes behaviour, look it up here to find the theorem and tests to revisit.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEAN_DIR = ROOT / "KvaLean"


@dataclass(frozen=True)
class Entry:
    """``theorem``: fully qualified Lean name; ``file``: its source, relative to the repository root;
    ``python``: dotted names of the functions it constrains; ``tests``: ``<file>::<test>`` in crossval;
    ``note``: what is checked, in a phrase."""

    theorem: str
    file: str
    python: tuple[str, ...]
    tests: tuple[str, ...]
    note: str = ""

    def __post_init__(self):  # a test named twice (families overlap) is listed once
        object.__setattr__(self, "tests", tuple(dict.fromkeys(self.tests)))


_R = "test_ridge_props.py::"
_F = "test_fill_props.py::"
_C = "test_certificates.py::"
_L = "test_identity_limit.py::"
_S = "test_stream_props.py::"
_SOLVE = ("ridgefill.ridge.solve_ridge",)
_FIT = ("ridgefill.ridge.fit_maps", "ridgefill.ridge.solve_ridge")
_FILL = ("ridgefill.fill.prefill",)
_PREDICT = ("ridgefill.fill.predict_inputs",)
_CONTEXT_FILL = ("ridgefill.fill.context_features", "ridgefill.fill.prefill")
_CHECK = ("ridgefill.certify.check_certificate",)
_EXPORT = ("ridgefill.certify.export_lean_certificate", "ridgefill.ridge.solve_ridge")

# the families of crossval tests
GAP = (_R + "test_gap_identity",)
OPTIMAL = (_R + "test_no_perturbation_lowers_objective", _R + "test_gap_identity")
UNIQUE = (_R + "test_minimiser_unique",)
NORMAL_EQ = (_R + "test_solve_matches_exact_minimiser",)
EXISTS = (_R + "test_positive_lambda_solves_singular_gram",)
RATE = (_R + "test_identity_rate",)
EXACT_TARGETS = (_R + "test_exact_targets_give_identity",)
LIMIT = (_L + "test_huge_lambda_gives_centred_identity",)
INTERCEPT_ERR = (_L + "test_intercept_error_bounded_by_map_error",)
STREAM = (_S + "test_merged_moments_equal_direct_moments",)
UPDATE = (_S + "test_ridge_update_solves_the_merged_normal_equations",)
IDENTITY_FILL = (_F + "test_identity_fill_is_ridge_fill_with_identity_maps",)
CAUSAL = (_F + "test_later_tokens_never_change_earlier_rows",)
LOWER = (_F + "test_lower_layers_exact",)
EXACT_ROWS = (_F + "test_exact_rows_exact_when_filled_cache_exact",)
EXACT_MODE = (_F + "test_no_filled_rows_is_exact_mode",)
NO_DROP = (_F + "test_every_row_has_a_cache_entry_at_every_layer",)
DECODE = (_F + "test_decoding_after_fill_is_an_exact_row_of_the_fill",)
CONTEXT = (_F + "test_context_features_are_causal",)
SELECT = ("test_select_props.py::test_selection_keeps_every_row_and_equals_the_one_pass_prefill",)
SELECTED_CAUSAL = ("test_select_props.py::test_selected_causal_on_the_real_selection",
                   "test_select_props.py::test_selection_of_earlier_rows_reads_later_tokens")
ENTRIES = (_F + "test_fill_modes_keep_every_entry_an_exact_row_sees",)
ROPE = (_F + "test_rope_keys_and_score_shift",)
CENTRED = (_F + "test_centred_mode_is_ridge_with_identity_and_mean_shift",)
STABILITY = ("test_stability_props.py::test_fill_error_within_lipschitz_bound",)
_ROPE = ("ridgefill.adapters.base.apply_rope",)
NUMERIC_CERTS = (_C + "test_certify_cli_on_tiny_calibrations", _C + "test_real_model_certificates",
                 _C + "test_certificates_reject_wrong_maps_and_tampering")
RIGOROUS_CERTS = (_C + "test_rigorous_certificate_encloses_exact_residual_and_gap",
                  _C + "test_rigorous_certificate_rejects_a_planted_weight",
                  _C + "test_rigorous_certificate_on_the_real_model")
EXACT_CERTS = (_C + "test_exact_certificates_from_rational_data", _C + "test_committed_lean_certificates",
               _C + "test_real_model_certificates")
LEAN_EXAMPLE = (_C + "test_certificate_lean_example",)
_M = "test_masked_props.py::"
MASK_EXACT = (_M + "test_kept_exact_entries_give_exact_rows",)
MASK_NONE = (_M + "test_mode_none_changes_an_exact_row",)
MASK_PEEK = (_M + "test_a_layer_reading_a_later_row_breaks_causality",)
_RIGOROUS = ("ridgefill.certify.rigorous_certificate",)


def _entries(file: str, names: str, python: tuple[str, ...], tests: tuple[str, ...], note: str = "") -> tuple[Entry, ...]:
    """One entry per name in the whitespace-separated ``names`` (``KvaLean.`` prefixed), all alike."""
    return tuple(Entry(f"KvaLean.{n}", f"KvaLean/{file}.lean", python, tests, note) for n in names.split())


REGISTRY: tuple[Entry, ...] = (
    # ---- KvaLean/Ridge.lean: the closed-form solve is the minimiser --------------------------------
    Entry("KvaLean.ridge_gap", "KvaLean/Ridge.lean", _SOLVE, GAP + RIGOROUS_CERTS,
          "J(w) = J(w★) + ‖X(w − w★)‖² + λ‖w − w★‖² at a normal-equation solution"),
    Entry("KvaLean.ridge_optimal", "KvaLean/Ridge.lean", _SOLVE, OPTIMAL + NUMERIC_CERTS,
          "λ ≥ 0: the normal-equation solution minimises J"),
    Entry("KvaLean.ridge_unique", "KvaLean/Ridge.lean", _SOLVE, UNIQUE + NUMERIC_CERTS,
          "λ > 0: at most one solution of the normal equations"),
    Entry("KvaLean.normal_eq_of_isMin", "KvaLean/Ridge.lean", _SOLVE, NORMAL_EQ + OPTIMAL,
          "a minimiser solves the normal equations"),
    Entry("KvaLean.ridge_isMin_unique", "KvaLean/Ridge.lean", _SOLVE, UNIQUE, "λ > 0: the minimiser is unique"),
    Entry("KvaLean.ridgeObjMulti_eq_sum", "KvaLean/Ridge.lean", _SOLVE, GAP + NORMAL_EQ,
          "the Frobenius objective is the sum of the column objectives"),
    Entry("KvaLean.ridge_multi_optimal", "KvaLean/Ridge.lean", _SOLVE, OPTIMAL + NORMAL_EQ,
          "multi-output: W_l minimises the Frobenius objective"),
    Entry("KvaLean.ridge_multi_unique", "KvaLean/Ridge.lean", _SOLVE, UNIQUE, "multi-output: W_l is unique"),
    Entry("KvaLean.intercept_optimal", "KvaLean/Ridge.lean", ("ridgefill.ridge.fit_maps",), OPTIMAL,
          "b = ȳ − x̄ w minimises over the intercept"),
    Entry("KvaLean.interceptObj_eq_centred", "KvaLean/Ridge.lean", _FIT, GAP + OPTIMAL,
          "with that intercept the objective is the centred ridge objective"),
    Entry("KvaLean.fit_maps_optimal", "KvaLean/Ridge.lean", _FIT, OPTIMAL + GAP,
          "centred solve plus intercept minimises over (w, b)"),
    *_entries("Ridge", "ridgeObj_add ridgeGrad_eq_zero normalEq_of_grad quad_nonneg_forces_zero", _SOLVE,
              GAP + OPTIMAL + UNIQUE, "supporting lemma"),
    *_entries("Ridge", "card_pos sum_sq_shift sum_residual_eq", ("ridgefill.ridge.fit_maps",), GAP + OPTIMAL,
              "supporting lemma (intercept)"),
    *_entries("Ridge", "sum_sub_mul_sub sum_append", ("ridgefill.ridge.fit_maps",), STREAM,
              "streaming statistics: RidgeStats.moments and RidgeStats.merged (methods the registry cannot name)"),
    Entry("KvaLean.ridge_update", "KvaLean/Ridge.lean", ("ridgefill.ridge.solve_ridge",),
          UPDATE + STREAM, "supporting lemma (more statistics): W + (G + ΔG + λI)⁻¹(ΔB − ΔG W) solves the merged "
          "normal equations, so the solve on merged statistics (RidgeStats.merged) is the update of the first fit"),
    # ---- KvaLean/Solve.lean: the solution exists (λ > 0), and (W, b) is unique ---------------------
    Entry("KvaLean.exists_solve_of_coercive", "KvaLean/Solve.lean", _SOLVE, EXISTS + NORMAL_EQ,
          "⟨u, A u⟩ ≥ μ‖u‖², μ > 0 ⇒ A w = c has a solution (Gaussian elimination, Schur complements)"),
    Entry("KvaLean.solve_unique_of_coercive", "KvaLean/Solve.lean", _SOLVE, EXISTS + UNIQUE,
          "… and only one"),
    Entry("KvaLean.exists_inverse_of_coercive", "KvaLean/Solve.lean", _SOLVE, EXISTS,
          "… so A has a two-sided inverse"),
    Entry("KvaLean.schur_coercive", "KvaLean/Solve.lean", _SOLVE, EXISTS,
          "the Schur complement of the last pivot is again μ-coercive (no zero pivot)"),
    Entry("KvaLean.exists_solve_addDiag", "KvaLean/Solve.lean", _SOLVE, EXISTS + NORMAL_EQ,
          "G ⪰ 0, λ > 0 ⇒ (G + λI) w = c has exactly one solution"),
    Entry("KvaLean.exists_normalEq", "KvaLean/Solve.lean", _SOLVE, EXISTS + NORMAL_EQ,
          "λ > 0 ⇒ (XᵀX + λI) w = Xᵀy + λw₀ has a solution"),
    Entry("KvaLean.existsUnique_normalEq", "KvaLean/Solve.lean", _SOLVE, EXISTS + UNIQUE,
          "λ > 0 ⇒ exactly one solution"),
    Entry("KvaLean.exists_normalEqMulti", "KvaLean/Solve.lean", _SOLVE, EXISTS + NORMAL_EQ,
          "λ > 0 ⇒ the multi-output normal equations have a solution W"),
    Entry("KvaLean.fit_maps_unique", "KvaLean/Solve.lean", ("ridgefill.ridge.fit_maps",), UNIQUE + GAP,
          "λ > 0, m > 0: every minimiser (w, b) is (w★, ȳ − x̄·w★)"),
    Entry("KvaLean.fit_maps_existsUnique", "KvaLean/Solve.lean", ("ridgefill.ridge.fit_maps",), EXISTS + UNIQUE + GAP,
          "λ > 0, m > 0: the intercept ridge problem has exactly one minimiser"),
    Entry("KvaLean.fit_maps_multi_optimal", "KvaLean/Solve.lean", _FIT, OPTIMAL + GAP + (_R + "test_context_penalty_gap_identity",),
          "multi-output: (W★, ȳ − x̄W★) minimises ‖XW + 1b − Y‖²_F + λ‖W − W₀‖²_F; with a context penalty α the "
          "features are [h(t), h(t−1)/√α] (fit_maps(context_penalty=α), mapped back to the raw features)"),
    Entry("KvaLean.fit_maps_multi_unique", "KvaLean/Solve.lean", _FIT, UNIQUE + GAP,
          "multi-output, λ > 0: (W★, ȳ − x̄W★) is the only minimiser over (W, b)"),
    *_entries("Solve", "extendLast_castSucc extendLast_last normSq_extendLast matVec_extendLast quad_extendLast "
              "matVec_schur quad_schur dot_zero_vec_left coercive_last_pos nonneg_of_mul_pos_right "
              "normSq_zero_of_coercive matVec_idMat matVec_addDiag matVec_gram quad_gram addDiag_coercive",
              _SOLVE, EXISTS + NORMAL_EQ, "supporting lemma (elimination)"),
    Entry("KvaLean.sum_centred_mul_eq_shifted", "KvaLean/Solve.lean", ("ridgefill.ridge.fit_maps",), STREAM,
          "centred moments = shifted sums − s sᵀ/n (RidgeStats.centred, a method the registry cannot name)"),
    *_entries("Solve", "ridgeObjB_eq_add ridgeObjBMulti_eq_sum", ("ridgefill.ridge.fit_maps",), GAP + UNIQUE,
              "supporting lemma (intercept)"),
    # ---- KvaLean/Identity.lean: large λ gives the identity fill -------------------------------------
    Entry("KvaLean.identity_fill_eq", "KvaLean/Identity.lean", _PREDICT + _FILL, IDENTITY_FILL,
          "W = I, b = 0 is the identity fill"),
    Entry("KvaLean.affineMap_idMat_zero", "KvaLean/Identity.lean", _PREDICT, IDENTITY_FILL, "h I + 0 = h"),
    Entry("KvaLean.ridge_identity_rate", "KvaLean/Identity.lean", _SOLVE, RATE, "λ²‖W_λ − I‖² ≤ ‖Xᵀ(Y − X)‖²"),
    Entry("KvaLean.ridge_tendsto_identity", "KvaLean/Identity.lean", _FIT, RATE + LIMIT,
          "W_λ → I as λ → ∞ (the map only; the intercept: fit_maps_tendsto_centred)"),
    Entry("KvaLean.ridge_eq_prior_of_exact", "KvaLean/Identity.lean", _SOLVE, EXACT_TARGETS,
          "targets equal to the inputs give W = I"),
    *_entries("Identity", "sum_ite_eq", _PREDICT, IDENTITY_FILL, "supporting lemma"),
    Entry("KvaLean.ridge_multi_identity_rate", "KvaLean/Identity.lean", _SOLVE, RATE + LIMIT,
          "λ²‖W_λ − W₀‖²_F ≤ ∑_c ‖Xᵀ(Y_c − X W₀_c)‖²"),
    Entry("KvaLean.ridge_multi_tendsto", "KvaLean/Identity.lean", _SOLVE, LIMIT, "W_λ → W₀ (Frobenius) as λ → ∞"),
    Entry("KvaLean.intercept_err_le", "KvaLean/Identity.lean", ("ridgefill.ridge.fit_maps",), INTERCEPT_ERR,
          "‖b − (x̄ − h̄)‖² ≤ ‖h̄‖² ‖W − I‖²_F"),
    Entry("KvaLean.fit_maps_tendsto_centred", "KvaLean/Identity.lean", ("ridgefill.ridge.fit_maps",) + _FILL,
          LIMIT + CENTRED,
          "(W_λ, b_λ) → (I, x̄ − h̄) as λ → ∞: the centred mode, not the identity fill"),
    Entry("KvaLean.centred_limit_eq_identity_iff", "KvaLean/Identity.lean", _FILL, LIMIT + EXACT_TARGETS + CENTRED,
          "the limit is the identity fill iff x̄ = h̄"),
    Entry("KvaLean.affineMap_idMat", "KvaLean/Identity.lean", _FILL, LIMIT, "h I + b = h + b"),
    Entry("KvaLean.ridge_err_le_residual", "KvaLean/Identity.lean",
          ("ridgefill.certify.layer_certificate", "ridgefill.certify.rigorous_certificate"),
          NUMERIC_CERTS + RIGOROUS_CERTS, "‖W − W★‖ ≤ ‖R‖/μ from G + λI ⪰ μI and the normal-equation residual R"),
    *_entries("Identity", "err_le_of_coercive", ("ridgefill.certify.layer_certificate",), NUMERIC_CERTS,
              "supporting lemma"),
    *_entries("Identity", "dot_mul_self_le dot_sub_right dot_col_idMat div_pos_of_pos le_of_mul_self_mul_le",
              _FIT, LIMIT + INTERCEPT_ERR, "supporting lemma"),
    # ---- KvaLean/Causality.lean: the fill prefill ---------------------------------------------------
    Entry("KvaLean.Decoder.filled_causal", "KvaLean/Causality.lean", _FILL + ("ridgefill.fill.context_features",),
          CAUSAL, "rows ≤ t ignore tokens after t, for any prediction from the split states of rows ≤ t"),
    Entry("KvaLean.Decoder.input_causal", "KvaLean/Causality.lean", _FILL, CAUSAL, "the same for the exact model"),
    Entry("KvaLean.Decoder.lower_layers_exact", "KvaLean/Causality.lean", _FILL, LOWER, "layers ≤ S are exact"),
    Entry("KvaLean.Decoder.lower_cache_exact", "KvaLean/Causality.lean", _FILL, LOWER,
          "cache entries of layers ≤ S are exact"),
    Entry("KvaLean.Decoder.exact_rows_exact", "KvaLean/Causality.lean", _FILL, EXACT_ROWS,
          "exact filled cache ⇒ every layer input and cache entry exact"),
    Entry("KvaLean.Decoder.exact_row_output", "KvaLean/Causality.lean", _FILL, EXACT_ROWS,
          "… and every exact row and decoding step has the exact output"),
    Entry("KvaLean.Decoder.exact_mode", "KvaLean/Causality.lean", _FILL, EXACT_MODE,
          "no filled rows: the filled model is the exact model"),
    Entry("KvaLean.Decoder.reads_every_row", "KvaLean/Causality.lean", _FILL, NO_DROP,
          "row t reads an entry of every row ≤ t, from the row's input or its prediction"),
    Entry("KvaLean.Decoder.no_token_dropped", "KvaLean/Causality.lean", _FILL, ENTRIES + NO_DROP,
          "fill modes: every filled row has an entry in every late layer for every exact row that sees it "
          "(sliding windows included), the cache of its prediction at its own position"),
    Entry("KvaLean.Decoder.none_entry", "KvaLean/Causality.lean", _FILL, ENTRIES,
          "mode none: no filled row keeps a late-layer entry"),
    Entry("KvaLean.Decoder.none_drops_token", "KvaLean/Causality.lean", _FILL, ENTRIES,
          "mode none violates no_token_dropped (a counterexample)"),
    *_entries("Causality", "Decoder.seenByExact_of", _FILL, ENTRIES, "supporting lemma"),
    *_entries("Causality", "Decoder.fillInput_succ Decoder.fillInput_causal", _FILL, CAUSAL, "supporting lemma"),
    Entry("KvaLean.Decoder.selected_causal", "KvaLean/Causality.lean", _FILL, CAUSAL + SELECT + SELECTED_CAUSAL,
          "exact set chosen from the whole prompt: row t is causal given the selection on rows ≤ t "
          "(checked on ridgefill.select where the selection agrees; no part makes the choice itself causal)"),
    Entry("KvaLean.Decoder.selection_not_causal", "KvaLean/Causality.lean", _FILL, SELECT + SELECTED_CAUSAL[1:],
          "the selection itself can carry a later token into an earlier row (a counterexample)"),
    Entry("KvaLean.Decoder.decode_eq_fill", "KvaLean/Causality.lean", _FILL, DECODE + EXACT_ROWS,
          "an exact row is decoding over the cache the fill left for the earlier rows"),
    Entry("KvaLean.Decoder.decode_exact", "KvaLean/Causality.lean", _FILL, EXACT_ROWS + DECODE,
          "decoding over the exact cache is the exact model"),
    *_entries("Causality", "Decoder.fillInput_congr_filled", _FILL, CAUSAL + SELECT, "supporting lemma"),
    *_entries("Causality", "Decoder.input_prefix_causal", _CONTEXT_FILL, CAUSAL + CONTEXT,
              "supporting lemma (the split states of rows ≤ t a prediction reads are causal)"),
    *_entries("Causality", "Decoder.fillCache_of_filled", _FILL, NO_DROP + CONTEXT,
              "supporting lemma (a filled row's late entry is the cache of its prediction)"),
    Entry("KvaLean.Decoder.fillCache_ofRowMap", "KvaLean/Causality.lean", _CONTEXT_FILL, CONTEXT + NO_DROP,
          "plain maps: a filled late row writes cache(f(h_S(t))), its own split state only"),
    Entry("KvaLean.Decoder.fillCache_ofContextMap", "KvaLean/Causality.lean", _CONTEXT_FILL, CONTEXT + NO_DROP,
          "context maps: a filled late row writes cache(f(h_S(t), h_S(t − 1))), zero before row 0"),
    # ---- KvaLean/Masked.lean: layers read the cache through a visibility mask ------------------------
    Entry("KvaLean.MDecoder.decode_entry_exact", "KvaLean/Masked.lean", _FILL, MASK_EXACT,
          "(a) causal layers, every entry an exact row sees kept and every kept filled entry exact ⇒ decoding "
          "an exact row over the kept entries is the exact model"),
    Entry("KvaLean.MDecoder.fill_modes_cover", "KvaLean/Masked.lean", _FILL, MASK_EXACT + ENTRIES,
          "the fill modes keep every entry an exact row sees (the coverage hypothesis of (a))"),
    Entry("KvaLean.MDecoder.none_changes_exact_row", "KvaLean/Masked.lean", _FILL, MASK_NONE,
          "(b) mode none drops an entry an exact row sees and changes its output (a concrete instance)"),
    Entry("KvaLean.MDecoder.reads_later_row_not_causal", "KvaLean/Masked.lean", _FILL, MASK_PEEK,
          "(c) a layer that reads a later row is a counterexample to causality"),
    Entry("KvaLean.MDecoder.input_causal", "KvaLean/Masked.lean", _FILL, MASK_PEEK + CAUSAL,
          "causal layers ⇒ the masked exact model is causal, whatever the prompt length"),
    *_entries("Masked", "sees_le MDecoder.fillInput_exact MDecoder.decode_entry MDecoder.addFirst_causal", _FILL,
              MASK_EXACT + MASK_NONE, "supporting lemma"),
    # ---- KvaLean/GramCert.lean: the reasoning of ridgefill certify --rigorous ------------------------
    Entry("KvaLean.gram_err_le_residual", "KvaLean/GramCert.lean", _RIGOROUS, RIGOROUS_CERTS,
          "A = ½(G + Gᵀ) + λI ⪰ μI, A W★ = B + λW₀ ⇒ μ²‖W − W★‖²_F ≤ ‖A W − (B + λW₀)‖²_F (all columns)"),
    Entry("KvaLean.gram_gap", "KvaLean/GramCert.lean", _RIGOROUS, RIGOROUS_CERTS,
          "J(W) − J(W★) = ‖W − W★‖²_A for the Gram-form objective of the float64 statistics"),
    Entry("KvaLean.gram_gap_le", "KvaLean/GramCert.lean", _RIGOROUS, RIGOROUS_CERTS,
          "‖W − V‖²_A ≤ p², ‖A V − (B + λW₀)‖²_F ≤ μq² ⇒ J(W) − J(W★) ≤ (p + q)² (the gap through the float64 solve V)"),
    Entry("KvaLean.bias_err_le", "KvaLean/GramCert.lean", _RIGOROUS, RIGOROUS_CERTS,
          "‖b − (x̄ − h̄W★)‖ ≤ ‖b − (x̄ − h̄W)‖ + ‖h̄‖‖W − W★‖_F, in squared form"),
    *_entries("GramCert", "frobSq_eq_cols dot_sub_left normSq_sub symAddDiag_symm quad_transpose dot_matVec_symm "
              "matVec_symAddDiag quad_symAddDiag err_le_of_coercive_mat gramObj_eq_sum gram_col_gap normSq_add_le "
              "quad_add_smul aNormSq_add_smul aNormSq_nonneg quad_le_residual cross_le_of_quad",
              _RIGOROUS, RIGOROUS_CERTS, "supporting lemma"),
    # ---- KvaLean/Stability.lean: fill errors propagate with Lipschitz layers -------------------------
    Entry("KvaLean.Decoder.fill_err_le", "KvaLean/Stability.lean", _FILL, STABILITY + EXACT_ROWS + DECODE,
          "Lipschitz layers and caches: every input within B_l, every cache entry within K_c(B_l + δ) "
          "(δ > 0 on a tiny decoder with computable constants; δ = 0 on the real fill)"),
    *_entries("Stability", "Decoder.errBound_nonneg Decoder.fillCache_err_le_of Decoder.errBound_zero", _FILL,
              STABILITY + EXACT_ROWS, "supporting lemma"),
    # ---- KvaLean/Rope.lean: RoPE scores depend on q − p; filled and exact keys share the rotation ----
    Entry("KvaLean.rope_score_rel", "KvaLean/Rope.lean", _ROPE, ROPE,
          "score(R_p x, R_q k) = score(x, R_(q−p) k) given the angle-subtraction identities"),
    Entry("KvaLean.rope_score_shift", "KvaLean/Rope.lean", _ROPE, ROPE,
          "the score is unchanged when query and key positions move together"),
    Entry("KvaLean.Decoder.fillCache_rope", "KvaLean/Rope.lean", _FILL, ROPE + NO_DROP,
          "a filled row's entry goes through the same rotation at its position as an exact row's"),
    # ---- KvaLean/Certificate.lean: the exact checker ------------------------------------------------
    Entry("KvaLean.RidgeInstance.check_sound", "KvaLean/Certificate.lean", _CHECK, EXACT_CERTS,
          "an accepted certificate solves the normal equations exactly"),
    Entry("KvaLean.RidgeInstance.optimal_of_check", "KvaLean/Certificate.lean", _EXPORT, EXACT_CERTS,
          "an accepted certificate's W is the minimiser"),
    Entry("KvaLean.RidgeInstance.unique_of_check", "KvaLean/Certificate.lean", _CHECK, EXACT_CERTS,
          "λ > 0: and the only one"),
    Entry("KvaLean.exampleInstance_check", "KvaLean/Certificate.lean", _CHECK, LEAN_EXAMPLE,
          "the committed example passes"),
    Entry("KvaLean.exampleInstance_optimal", "KvaLean/Certificate.lean", ("ridgefill.certify.export_lean_certificate",),
          LEAN_EXAMPLE, "the committed example is optimal"),
    Entry("KvaLean.badInstance_rejected", "KvaLean/Certificate.lean", _CHECK, LEAN_EXAMPLE,
          "the perturbed example is rejected"),
    *_entries("Certificate", "allFin_spec", _CHECK, EXACT_CERTS, "supporting lemma"),
    # ---- KvaLean/CertExamples.lean: the committed exact certificates, as named theorems -------------
    *(Entry(f"KvaLean.CertExamples.{n}_optimal", "KvaLean/CertExamples.lean", _CHECK, EXACT_CERTS,
            "the kernel accepts this committed certificate: its W is the ridge minimiser")
      for n in ("dataA", "dataB", "statsLast")),
    *(Entry(f"KvaLean.CertExamples.{n}_rejected", "KvaLean/CertExamples.lean", _CHECK, EXACT_CERTS,
            "the kernel rejects this wrong certificate") for n in ("dataAWrong", "statsLastWrong")),
    # ---- KvaLean/LinAlg.lean: finite sums and vectors ------------------------------------------------
    *_entries("LinAlg", "fin_cases_last sum_zero_dim sum_succ sum_congr sum_const_zero sum_lin sum_lin_of sum_add "
              "mul_sum sum_mul sum_eq_lin3 sum_comm sum_nonneg sum_le_sum sum_eq_zero_iff_of_nonneg mul_self_nonneg "
              "mul_self_eq_zero normSq_nonneg normSq_eq_zero_iff dot_comm dot_zero_left dot_add_smul_left "
              "dot_add_right dot_smul_right normSq_add normSq_smul normSq_add_smul matTVec_sub dot_matVec",
              _SOLVE, GAP + OPTIMAL + UNIQUE + RATE, "supporting lemma"),
    *_entries("LinAlg", "matVec_add matVec_smul matVec_sub", _PREDICT + _SOLVE, GAP + IDENTITY_FILL,
              "supporting lemma"),
)


# --------------------------------------------------------------------------------------------------
# reading the Lean sources
# --------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"(?m)^\s*(?:@\[[^\]]*\]\s*)*((?:private|protected|noncomputable|public|nonrec)\s+)*"
                    r"(theorem|lemma|namespace|section|end|def|abbrev|structure|instance|axiom)\b[ \t]*([^\s:({\[]*)")


def lean_files() -> list[Path]:
    """Every ``KvaLean/*.lean`` file (and ``KvaLean.lean``), sorted."""
    files = sorted(LEAN_DIR.glob("**/*.lean"))
    top = ROOT / "KvaLean.lean"
    return ([top] if top.is_file() else []) + files


@functools.lru_cache(maxsize=1)
def checker():
    """``.ci/kvalean_check.py`` (the scan of ``.ci/check-lean``), loaded by path: it is not a package."""
    spec = importlib.util.spec_from_file_location("kvalean_check", ROOT / ".ci" / "kvalean_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_of(path: Path) -> str:
    """The Lean source with comments (``--``, nested ``/- -/``, docstrings) and string and character
    literals blanked out, line structure kept (the same stripping as the scan of ``.ci/check-lean``)."""
    return checker().strip(path.read_text(encoding="utf-8"))


def theorems(path: Path) -> dict[str, bool]:
    """Fully qualified theorem (and lemma) names declared in ``path``, each mapped to whether it is
    public (not ``private``). Tracks ``namespace``/``section``/``end``."""
    out: dict[str, bool] = {}
    scopes: list[tuple[str, str]] = []  # (kind, name)
    for m in _TOKEN.finditer(code_of(path)):
        mods, kind, name = m.group(1) or "", m.group(2), m.group(3)
        if kind == "namespace":  # `namespace A.B` opens two scopes, `end A.B` closes both
            scopes += [("namespace", part) for part in name.split(".")]
        elif kind == "section":
            scopes += [("section", part) for part in name.split(".")] if name else [("section", "")]
        elif kind == "end":
            del scopes[len(scopes) - (name.count(".") + 1 if name else 1):]
        elif kind in ("theorem", "lemma") and name:
            ns = ".".join(n for k, n in scopes if k == "namespace" and n)
            full = name[len("_root_."):] if name.startswith("_root_.") else (f"{ns}.{name}" if ns else name)
            out[full] = "private" not in mods
    return out


FORBIDDEN = re.compile(r"(?m)\b(sorry|admit|native_decide|sorryAx)\b|^\s*(?:private\s+|protected\s+)?axiom\s")


def forbidden(path: Path) -> list[str]:
    """``sorry``/``admit``/``native_decide``/``axiom`` occurrences in the code of ``path`` (not comments)."""
    return [m.group(0).strip() for m in FORBIDDEN.finditer(code_of(path))]
