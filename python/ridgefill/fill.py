"""The fill prefill (paper, "Approach"): exact lower layers, predicted late-layer cache rows.

Data path for a prompt of ``N`` rows, split ``S``, ``L`` layers:

1. Layers ``0..S`` run exactly on every row (causal attention, as in the plain forward).
2. ``h_S`` (the output of layer ``S``) is the split state. For each late layer ``l > S`` every
   *filled* row predicts its layer input ``x̂_l = h_S W_l + b_l`` (:func:`predict_inputs`; context maps read
   ``[h_S(t), h_S(t−1)]``, :func:`context_features`, the default of ``ridgefill calibrate``) and writes
   only that layer's keys and values from it, through the layer's own input norm, K/V projections
   and RoPE at the row's true position. Filled rows run no attention and no MLP in late layers.
3. *Exact* rows (the last ``tail`` rows plus any ``exact_rows``) run every late layer in full,
   attending causally to the mixed cache (filled rows' predicted K/V, exact rows' true K/V).

The result is a standard ``transformers`` cache holding K/V for every row at every layer, so
decoding continues with ``model.generate`` and every decoding step runs the full model. In
sliding-window layers (Gemma 3) only the last window of filled rows is ever read: filled rows that
no exact row sees get no K/V there (:meth:`~ridgefill.adapters.DecoderAdapter.needed_filled_rows`),
and the cache keeps the last ``window`` rows of those layers.

Modes (one entry point for the method and its baselines):

- ``"ridge"``: the fitted maps (needs ``maps``).
- ``"identity"``: ``W_l = I``, ``b_l = 0``: filled rows write late-layer K/V from ``h_S`` itself.
- ``"none"``: filled rows get no K/V in layers ``> S``. Exact rows then attend, in late layers, to
  the exact rows only (the filled positions are masked out); the returned cache's late layers hold
  only the exact rows' entries, so later decoding steps see the same thing.
- ``"exact"``: the plain ``transformers`` forward over all rows (the reference).

Lean: ``KvaLean.Causality`` (``filled_causal``, ``lower_layers_exact``, ``exact_rows_exact``,
``no_token_dropped``) and ``KvaLean.Identity.identity_fill_eq`` state the properties of this function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal

import torch
from torch import Tensor

from .adapters import adapter_for
from .adapters.base import record_sliding_windows, trim_sliding_windows, write_rows
from .errors import InputError, NonFiniteError
from .maps import RidgeMaps
from .refit import PromptRefit, fit_count
from .select import (AttentionScores, Select, Selection, as_selection, check_leverage_stats, choose_rows,
                     leverage_scores, ngram_scores, uses_leverage)
from .validate import binds_prompt, check_choice, check_context, check_int, check_real, check_rows, prompt_digest

Mode = Literal["ridge", "centred", "identity", "none", "exact"]
#: ``kv_hook(layer, keys, values, filled_positions) -> (keys, values)``: see :func:`prefill`.
KVHook = Callable[[int, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
MODES: tuple[str, ...] = ("exact", "ridge", "centred", "identity", "none")


@dataclass
class PrefillResult:
    """What :func:`prefill` returns.

    Attributes:
        cache: a ``transformers`` ``DynamicCache`` with K/V for every row at every layer (in mode
            ``"none"``: late layers hold the exact rows only).
        logits: ``[batch, 1, vocab]`` for the last row, or ``[batch, len(exact_positions), vocab]``
            with ``logits="exact"``; float in the model dtype.
        exact_positions: sorted ``int64`` ``[rows]``: the rows that ran every layer.
        split: ``S`` (``None`` in mode ``"exact"``).
        mode: the mode used.
        selected: sorted ``int64`` ``[k]``: the rows chosen by ``select`` (a subset of
            ``exact_positions``); ``None`` without selection.
        prompt_rows: ``N``, the length of the prompt prefilled (set by :func:`prefill`).
        prompt_sha256: :func:`ridgefill.validate.prompt_digest` of its ``input_ids`` (set by :func:`prefill`);
            :func:`generate_after` refuses other ids.
        consumed: set by :func:`generate_after`, which extends ``cache`` in place: a result decodes once.
        refit_maps: with ``refit`` (and filled rows), the refitted maps the filled rows used, ``(weights
            [L-S-1, batch, d, d], biases [L-S-1, batch, d])`` in the model dtype (one map per prompt of the
            batch; ``(L-S-1)·batch·d²`` values kept with the result); else ``None``.
    """

    cache: object
    logits: Tensor
    exact_positions: Tensor
    split: int | None
    mode: str
    selected: Tensor | None = None
    prompt_rows: int | None = None
    prompt_sha256: str | None = None
    consumed: bool = False
    refit_maps: tuple[Tensor, Tensor] | None = None


def exact_positions(num_rows: int, tail: int, exact_rows: Iterable[int] = ()) -> Tensor:
    """Sorted unique positions that run the full model: the last ``tail`` rows plus ``exact_rows``.

    Raises:
        InputError: ``tail`` outside ``1..num_rows``, or an exact row outside ``0..num_rows-1``.
    """
    if not 1 <= tail <= num_rows:
        raise InputError(f"tail={tail} must be between 1 and the prompt length {num_rows}: the last row "
                         "must be exact, and the tail cannot be longer than the prompt (use mode='exact' "
                         "to run every row exactly)")
    rows = torch.as_tensor(list(exact_rows), dtype=torch.long)
    if rows.numel() and (rows.min() < 0 or rows.max() >= num_rows):
        raise InputError(f"exact_rows must lie in 0..{num_rows - 1}; got {rows.tolist()}")
    return torch.unique(torch.cat([rows, torch.arange(num_rows - tail, num_rows)]))


def predict_inputs(h_split: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The RidgeFill prediction ``x̂_l = h_S W_l + b_l``.

    Args:
        h_split: ``[batch, rows, f]`` split state of the filled rows (``f = d``), or for context maps their
            :func:`context_features` (``f = 2d``).
        weight: ``W_l`` ``[f, k]``; bias: ``b_l`` ``[k]`` (same dtype as ``h_split``); ``k = d`` for
            input maps, ``2·kv_dim`` for K/V maps (whose prediction is the pre-RoPE keys and values); or
            one map per batch row, ``[batch, f, k]`` and ``[batch, k]`` (maps refitted per prompt).

    Returns:
        ``[batch, rows, k]``. With ``W = I`` and ``b = 0`` it is ``h_S`` itself, the identity fill
        (Lean: ``KvaLean.Identity.identity_fill_eq``).
    """
    if weight.ndim == 3:  # one map per prompt of the batch (maps refitted per prompt, :mod:`ridgefill.refit`)
        return torch.baddbmm(bias[:, None, :], h_split, weight)
    out = torch.addmm(bias, h_split.reshape(-1, h_split.shape[-1]), weight)
    return out.view(*h_split.shape[:-1], weight.shape[-1])


def context_features(h_split: Tensor, context: int) -> Tensor:
    """The input rows of the maps: ``h_S`` itself (``context = 0``), or for context maps (``context = 1``)
    each row's split state beside the previous row's, ``[h_S(t), h_S(t−1)]``, with zeros before row 0.

    Row ``t``'s features read rows ``t − 1`` and ``t`` only, so a filled row's prediction stays causal
    (Lean: ``KvaLean.Decoder.fillCache_ofContextMap``, ``KvaLean.Decoder.filled_causal``). The first row of
    every calibration chunk (position 0) gets zeros as its previous state, as row 0 of a prompt does.

    Args:
        h_split: ``[..., rows, d]`` split states of consecutive rows from position 0 (any float dtype).
        context: ``0`` or ``1``.

    Returns:
        ``[..., rows, d]`` (``h_split`` itself) or ``[..., rows, 2d]``, in the dtype of ``h_split``.

    Raises:
        InputError: ``context`` not 0 or 1.
    """
    context = check_context(context)
    if context == 0:
        return h_split
    prev = torch.nn.functional.pad(h_split.narrow(-2, 0, h_split.shape[-2] - 1), (0, 0, 1, 0))
    return torch.cat([h_split, prev], -1)


def _rows(x: Tensor, index: Tensor, dim: int) -> Tensor:
    """``x`` restricted to ``index`` along ``dim``: a view when the index is a contiguous range."""
    n = index.numel()
    if n and int(index[-1] - index[0]) == n - 1:
        return x.narrow(dim, int(index[0]), n)
    return x.index_select(dim, index)


def _check_finite(x: Tensor, where: str) -> None:
    if not torch.isfinite(x).all():
        raise NonFiniteError(f"NaN or Inf in the activations at {where}; check the model weights, the "
                             "maps and the dtype (float16 can overflow: use float32 or bfloat16)")


@binds_prompt
@torch.inference_mode()
def prefill(model: torch.nn.Module, input_ids: Tensor, maps: RidgeMaps | None = None, *, tail: int,
            exact_rows: Iterable[int] = (), mode: Mode = "ridge", split: int | None = None,
            logits: Literal["last", "exact"] = "last", kv_hook: KVHook | None = None,
            fast: bool = True, select: Select | Selection | None = None, refit: float = 0.0,
            refit_rows: Iterable[int] | None = None) -> PrefillResult:
    """Prefill ``input_ids`` with RidgeFill (or a baseline) and return the cache and logits.

    Args:
        model: a causal LM with an adapter (see :mod:`ridgefill.adapters`), in eval mode.
        input_ids: ``[batch, N]`` int64 token ids (no padding; the batch shares its exact rows).
        maps: fitted maps (modes ``"ridge"`` and ``"centred"``); checked against ``model`` and ``split``.
        tail: number of final rows that run the full model (``1 ≤ tail ≤ N``).
        exact_rows: further absolute positions that run the full model.
        mode: ``"ridge"``, ``"centred"``, ``"identity"``, ``"none"`` or ``"exact"`` (module docstring).
        split: ``S`` (``0 ≤ S ≤ L-2``); defaults to ``maps.split``; required for identity/none without maps.
        logits: ``"last"`` for the last row only, ``"exact"`` for every exact row (chosen rows included).
        kv_hook: evaluation extension point (splice tests, :mod:`ridgefill.evaluate.splice`): in the
            fill modes, for each late layer ``l``, called as ``kv_hook(l, k, v, filled)``
            with the filled rows' predicted keys (after RoPE) and values ``[batch, kv_heads, rows,
            head_dim]`` and their positions ``filled`` ``[rows]``, before any exact row attends to them
            (in sliding-window layers only the rows some exact row sees, see
            :meth:`~ridgefill.adapters.DecoderAdapter.needed_filled_rows`);
            it returns the ``(k, v)`` to write instead (same shapes). ``None``: no hook.
        fast: compute the filled rows' K/V of all late layers in one batched step
            (:meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`) when the adapter has it, there is no
            ``kv_hook`` and every late layer reads every filled row; the values equal the per-layer
            path's (``fast=False``, the reference) up to float rounding.
        select: a :class:`Select` to choose further exact rows: from the exact rows' late-layer
            attention (``by="attention"``: two passes; fill modes other than ``"none"``), or from the
            prompt alone (``by="leverage"``: one pass, any fill mode; ``maps`` with a calibration
            covariance must be given, also for ``"identity"`` and ``"none"``), or from the token ids the
            filled rows share with the last ``queries`` rows of the tail (``by="ngram"``: one pass, any fill
            mode; ``exact_rows`` outside the tail are not the question); or a :class:`Selection` of several such parts, each with its own budget and within the
            selection's ``total`` when it has one (leverage and n-gram parts first, before the late layers;
            then the attention parts, all scored in the same first pass).
            ``None``: no selection.
        refit: ``ρ ≥ 0``; ``> 0`` refits each late layer's map, before its filled rows write their K/V,
            on the calibration statistics plus the exact rows' own ``(h_S, x_l)`` pairs, the ``T`` exact
            rows together weighing ``ρ`` times the ``n`` calibration rows (each counted ``α = ρ n / T``
            times; :mod:`ridgefill.refit`; row 0, the attention sink, is left out of the pairs). Mode
            ``"ridge"`` with input maps that store their calibration statistics. With ``select`` the maps
            are refitted once, in the first pass, on its exact rows (the tail, ``exact_rows`` and rows chosen
            up front by leverage or n-gram; or ``refit_rows``), and the later passes keep the filled rows' K/V
            (refitting again on the chosen rows too and rewriting them answered fewer needles at 4K and 8K
            tokens and costs a second fill: docs/evaluate.md, "Eighth session"). ``0`` (default): the
            calibration maps (docs/evaluate.md measures ``ρ = 4``; it answers more needles at 8K with
            selection and costs loss, so it is not a default). The refitted maps depend on every row they
            are fitted on, so a filled row's K/V carry information from those rows to every row after the
            filled one: to score exact rows of the prompt itself (a loss evaluation), fit on rows before the
            scored ones only (``refit_rows``), or the scores see tokens after their own position.
        refit_rows: positions of the rows the refit fits on, each in the tail or ``exact_rows`` (row 0 is
            always left out); ``None`` (default): every exact row of the first pass.

    Returns:
        :class:`PrefillResult`; with ``select`` its ``selected`` holds the chosen rows (also in
        ``exact_positions``). The cache and logits equal those of a one-pass prefill with the chosen rows
        given as ``exact_rows`` (up to float rounding); with ``refit``, of that prefill with the first pass's
        refitted maps (``refit_maps``) as its maps and no refit. With ``refit`` its ``refit_maps`` hold the
        maps the filled rows used.

    Raises:
        InputError: a bad type, shape or value of ``input_ids``, ``mode``, ``tail`` (an integer, not a
            float or bool), ``exact_rows``, ``split``, ``logits`` (only ``"last"`` or ``"exact"``), ``maps``
            or ``select``; on models with recurrent-state layers (:class:`~ridgefill.adapters.HybridAdapter`),
            exact rows outside the tail, a ``kv_hook``, ``select`` or K/V maps; ``refit`` not a finite
            number ``≥ 0``, or ``> 0`` outside mode ``"ridge"`` or with maps lacking calibration statistics.
        MapsMismatchError: ``maps`` belong to another model or split.
        NonFiniteError: NaN/Inf activations.
    """
    check_choice(mode, "mode", MODES)
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.shape[1] < 1 \
            or input_ids.dtype != torch.long:
        got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise InputError(f"input_ids must be an int64 tensor [batch, rows]; got {got}")
    if select is not None and not isinstance(select, (Select, Selection)):
        raise InputError(f"select must be a ridgefill.select.Select, a Selection or None; got {type(select).__name__}")
    if select is not None and (mode == "exact" or (mode == "none" and select.by == "attention")):
        raise InputError(f"select chooses exact rows from the attention to the filled rows' K/V; mode {mode!r} "
                         "has none: use it with 'ridge', 'centred' or 'identity'"
                         + ("" if mode == "exact" else " (or make every part by='leverage' or 'ngram')"))
    vocab = model.get_input_embeddings().num_embeddings
    if input_ids.numel() == 0 or int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        got = "no rows" if input_ids.numel() == 0 else f"ids in {int(input_ids.min())}..{int(input_ids.max())}"
        raise InputError(f"input_ids must be token ids in 0..{vocab - 1} (this model's vocabulary) with at least "
                         f"one batch row; got {got}: tokenize with this model's tokenizer")
    n = input_ids.shape[1]
    tail = check_int(tail, "tail", lo=1, hi=n, hint="the last row must be exact and the tail cannot be longer than "
              "the prompt (use mode='exact' to run every row exactly)")
    exact_rows = check_rows(exact_rows, "exact_rows", n)
    check_choice(logits, "logits", ("last", "exact"))
    if split is not None:
        split = check_int(split, "split", lo=0)
    if maps is not None and not isinstance(maps, RidgeMaps):
        raise InputError(f"maps must be a RidgeMaps (ridgefill.load_maps) or None; got {type(maps).__name__}")
    if kv_hook is not None and not callable(kv_hook):
        raise InputError(f"kv_hook must be callable or None; got {type(kv_hook).__name__}")
    ex = exact_positions(n, tail, exact_rows).to(input_ids.device)
    refit = check_real(refit, "refit", lo=0.0, hint="the weight of the exact rows, as a multiple of the calibration "
                       "rows, in the refit of the maps (0: off)")
    if refit > 0 and mode != "ridge":
        raise InputError(f"refit refits the ridge maps on the exact rows; mode {mode!r} has none: use mode='ridge' "
                         "or refit=0 (--mode ridge or --refit 0)")
    if refit_rows is not None:
        given = check_rows(refit_rows, "refit_rows", n)
        refit_rows = torch.as_tensor(given, dtype=torch.long, device=ex.device)
        refit_rows = refit_rows[refit_rows != 0]
        shown = given if len(given) <= 12 else given[:12] + ["..."]
        if refit <= 0:
            raise InputError(f"refit_rows {shown} were given without refit: pass refit > 0, or leave refit_rows out")
        if refit_rows.numel() == 0:
            raise InputError("refit_rows must hold exact rows other than row 0 (the sink is never fitted on); got "
                             f"{shown}")
        if not torch.isin(refit_rows, ex).all():
            bad = refit_rows[~torch.isin(refit_rows, ex)].tolist()[:12]
            raise InputError(f"refit_rows must be exact rows (the tail or exact_rows); rows {bad} are filled rows: "
                             "add them to exact_rows or leave them out")
    if mode == "exact":
        return _prefill_exact(model, input_ids, ex, logits)

    adapter = adapter_for(model)
    L = adapter.num_layers
    if mode in ("ridge", "centred"):
        if maps is None:
            raise InputError(f"mode={mode!r} needs maps: fit them with `ridgefill calibrate` and load them "
                             "with ridgefill.load_maps")
        maps.check_model(model, split)
        split = maps.split
        if refit > 0 and maps.context:
            raise InputError("refit refits maps that read the row's own h_S; these are context maps (context 1): "
                             "use maps calibrated with --context 0, or refit=0")
        if refit > 0:
            fit_count(maps)  # the statistics the refit needs, checked before any layer runs
    elif split is None:
        split = maps.split if maps is not None else None
    if split is None or not 0 <= split <= L - 2:
        raise InputError(f"split S={split} is out of range: this model has {L} layers, so 0 ≤ S ≤ {L - 2} "
                         "(at least one late layer)")

    recurrent = adapter.recurrent_layers  # hybrid models: layers with a recurrent state, not K/V
    if recurrent:
        adapter.check_exact_rows(n, ex)
        if kv_hook is not None or select is not None or (mode == "ridge" and maps.kind != "inputs"):
            raise InputError(f"this model has recurrent-state layers ({list(recurrent)}): kv_hook (splice tests), "
                             "select (row selection) and K/V maps cover attention layers only; use input maps "
                             "and a longer tail")
    device = input_ids.device
    positions = torch.arange(n, device=device)
    x = adapter.embed(input_ids)
    rope = adapter.rope(positions, x)
    keys, values = [], []
    state = adapter.new_state() if recurrent else None  # recurrent layers' states, in keys[l] (values[l] None)

    def buffers() -> tuple[Tensor, Tensor]:
        shape = (x.shape[0], adapter.num_kv_heads, n, adapter.head_dim)
        return x.new_empty(shape), x.new_empty(shape)

    for layer in range(split + 1):  # lower layers: every row, exactly
        k, v = (state, None) if layer in recurrent else buffers()
        x = adapter.layer(layer, x, rope, positions, k, v)
        keys.append(k)
        values.append(v)
    _check_finite(x, f"the split state h_S (output of layer {split})")

    kind = maps.kind if mode == "ridge" else "inputs"
    feats = context_features(x, maps.context) if mode == "ridge" else x  # the maps' input rows
    fill = _LateFill(adapter, range(split + 1, L), x, feats, rope, _fill_maps(mode, maps, x), kv_hook,
                     fast and kv_hook is None and kind == "inputs", none=mode == "none", kind=kind, state=state,
                     refit=(maps, refit, refit_rows) if refit > 0 else None)
    selection = as_selection(select) if select is not None else None
    parts = selection.parts if selection is not None else ()
    taken = [torch.zeros(0, dtype=torch.long, device=device) for _ in parts]  # rows each part chose

    total = selection.budget_rows(n) if selection is not None else 0

    def choose(part: int, scores: Tensor, budget: int, r: int = -1) -> None:
        """Part ``part`` chooses up to ``budget`` rows in all (``r``: the attention round), within the total
        less what every part took and what the attention parts listed before it keep for later rounds."""
        nonlocal ex
        filled = torch.ones(n, dtype=torch.bool, device=device)
        filled[ex] = False
        kept = sum(max(0, parts[j].budget_rows(n) - taken[j].numel()) for j in range(part)
                   if parts[j].by == "attention" and r + 1 < parts[j].rounds) if r >= 0 else 0
        left = total - sum(t.numel() for t in taken) - kept
        new = choose_rows(scores, filled, parts[part], max(0, min(budget - taken[part].numel(), left)))
        taken[part] = torch.cat([taken[part], new])
        ex = torch.unique(torch.cat([ex, new]))

    if uses_leverage(select):  # query-agnostic parts: scored from h_S
        check_leverage_stats(select, maps)
        maps.check_model(model, split)
    scored = {}  # each kind's scores once (a lexical part's per question length), whatever the number of parts
    for i, part in enumerate(parts):  # parts chosen before the late layers
        if part.by == "attention":
            continue
        key = (part.by, part.queries if part.by == "ngram" else 0)
        if key not in scored:  # a lexical part's question: the tail's last rows, never exact_rows outside it
            scored[key] = (leverage_scores(x, maps.mean_h, maps.cov_h) if part.by == "leverage" else
                           ngram_scores(input_ids, torch.arange(max(n - tail, n - part.queries), n, device=device)))
        choose(i, scored[key], part.budget_rows(n))
    rounds = selection.rounds if selection is not None else 0
    ran = None  # the exact rows of the last pass: a round that chose nothing reuses its scores
    for r in range(rounds + 1):  # attention parts: score in a pass, choose their round's share, rerun
        if ran is None or not torch.equal(ran, ex):
            scorers = {i: AttentionScores(adapter, n, p) for i, p in enumerate(parts) if p.by == "attention" and r < p.rounds}
            out, ran = fill.run(ex, list(scorers.values())), ex
        for i, scorer in scorers.items():
            if r < parts[i].rounds:
                choose(i, scorer.scores, parts[i].budget_rows(n) * (r + 1) // parts[i].rounds, r)
    selected = torch.cat(taken).sort().values if parts else None

    result = adapter.logits(out[:, -1:] if logits == "last" else out)
    _check_finite(result, "the logits of the exact rows")
    late_k, late_v = fill.cache_rows(ex)
    cache = adapter.build_cache(keys + late_k, values + late_v)
    return PrefillResult(cache, result, ex, split, mode, selected, refit_maps=fill.refitted)


def _fill_maps(mode: str, maps: RidgeMaps | None, like: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(W [late, d, d], b [late, d])`` in the dtype/device of ``like`` for the mode, or ``None`` for
    the identity fill (``W = I``, ``b = 0``) and mode ``"none"``."""
    if mode == "ridge":
        m = maps.to(dtype=like.dtype, device=like.device)
        return m.weights, m.biases
    if mode == "centred":
        bias = maps.centred_biases()
        d = bias.shape[-1]
        eye = torch.eye(d, dtype=like.dtype, device=like.device).expand(bias.shape[0], d, d)
        return eye, bias.to(dtype=like.dtype, device=like.device)
    return None


class _LateFill:
    """The late layers ``S+1..L-1`` of one prefill: the filled rows' predicted K/V and the exact rows.

    :meth:`run` makes sure every filled row a late layer can read has K/V (computed once per row and
    layer, from ``h_S`` through the maps), then runs the exact rows through every late layer, attending
    to the mixed cache. Calling it again with more exact rows (row selection) recomputes only the late
    layers of the exact rows; the rows that became exact overwrite their predicted K/V with exact ones.
    With ``refit`` (``(maps, ρ, rows)``, :mod:`ridgefill.refit`; ``rows``: the positions fitted on, or ``None``
    for every exact row but row 0) the first run refits each layer's map on the
    exact rows' inputs of that layer just before its filled rows write their K/V; later runs keep those
    maps (:attr:`refitted`: ``[late, batch, d, d]`` and ``[late, batch, d]``) and the K/V written from them.
    """

    def __init__(self, adapter, late: range, h: Tensor, feats: Tensor, rope, maps: tuple[Tensor, Tensor] | None,
                 kv_hook: KVHook | None, batched: bool, none: bool, kind: str = "inputs", state=None,
                 refit: tuple[RidgeMaps, float, Tensor | None] | None = None):
        self.adapter, self.late, self.h, self.feats, self.rope = adapter, late, h, feats, rope
        self.maps, self.kv_hook, self.batched, self.none, self.kind = maps, kv_hook, batched, none, kind
        self.state = state  # recurrent layers' conv and delta-rule states (hybrid models), else None
        self.refit, self.refitted = refit, None
        self.attention = [layer not in adapter.recurrent_layers for layer in late]
        b, n = h.shape[0], h.shape[1]
        shape = (len(late), b, adapter.num_kv_heads, n, adapter.head_dim)
        self.keys, self.values = h.new_zeros(shape), h.new_zeros(shape)
        self.have = torch.zeros(len(late), n, dtype=torch.bool, device=h.device)  # rows holding K/V

    def _filled(self, ex: Tensor) -> Tensor:
        filled = torch.ones(self.h.shape[1], dtype=torch.bool, device=self.h.device)
        filled[ex] = False
        return filled.nonzero().flatten()

    def _write_filled(self, ex: Tensor, fl: Tensor) -> None:
        """Every late layer's filled-row K/V from the calibration maps (batched when possible)."""
        ad = self.adapter
        needs = [ad.needed_filled_rows(layer, fl, ex) if att else None for layer, att in zip(self.late, self.attention)]
        if (self.batched and not self.have.any() and all(self.attention) and hasattr(ad, "fill_kv")
                and ad.supports_fill_kv() and all(nd is None for nd in needs)):
            self._fill_batched(fl)
            self.have[:, fl] = True
            return
        for i, layer in enumerate(self.late):
            self._write_layer(i, layer, fl, ex, None if self.maps is None else (self.maps[0][i], self.maps[1][i]))

    def _write_layer(self, i: int, layer: int, fl: Tensor, ex: Tensor, maps: tuple[Tensor, Tensor] | None) -> None:
        """Late layer ``layer`` (index ``i``): its filled rows ``fl`` that lack K/V write them from
        ``x̂ = h_S W + b`` (``maps``; ``None``: the identity fill); a recurrent layer instead has the
        filled rows advance its state (once)."""
        ad = self.adapter
        if not self.attention[i]:  # a recurrent layer: the filled rows advance its state (first, once)
            if not self.have[i].any():
                h = _rows(self.h if maps is None else self.feats, fl, 1)
                ad.advance_state(layer, h if maps is None else predict_inputs(h, *maps), self.state)
                self.have[i, fl] = True
            return
        need = ad.needed_filled_rows(layer, fl, ex)
        rows = fl if need is None else fl[need]
        rows = rows[~self.have[i, rows]]
        if rows.numel() == 0:
            return
        x_hat = _rows(self.h, rows, 1) if maps is None else predict_inputs(_rows(self.feats, rows, 1), *maps)
        if self.kind == "kv":  # K/V maps predict the pre-RoPE keys and values themselves
            kf, vf = ad.kv_from_targets(layer, x_hat, self.rope.rows(rows))
        else:
            kf, vf = ad.kv(layer, x_hat, self.rope.rows(rows))
        if self.kv_hook is not None:
            kf, vf = self.kv_hook(layer, kf, vf, rows)
        write_rows(self.keys[i], self.values[i], rows, kf, vf)
        self.have[i, rows] = True

    def _fill_batched(self, fl: Tensor) -> None:
        """All late layers at once (:meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`)."""
        first, count = int(fl[0]), fl.numel()
        contiguous = int(fl[-1]) - first + 1 == count
        if contiguous:
            outs = self.keys.narrow(3, first, count), self.values.narrow(3, first, count)
        else:
            shape = self.keys.shape[:3] + (count, self.keys.shape[4])
            outs = self.h.new_empty(shape), self.h.new_empty(shape)
        w, b = self.maps if self.maps is not None else (None, None)
        self.adapter.fill_kv(self.late, _rows(self.h if w is None else self.feats, fl, 1), w, b, self.rope.rows(fl), *outs)
        if not contiguous:
            self.keys.index_copy_(3, fl, outs[0])
            self.values.index_copy_(3, fl, outs[1])

    def run(self, ex: Tensor, scorers: list[AttentionScores] = ()) -> Tensor:
        """Run the exact rows ``ex`` (sorted ``int64`` ``[E]``) through the late layers; returns their
        output of the last layer ``[batch, E, d]``. Each of ``scorers`` records the attention of its
        last ``scorer.rows`` exact rows (query and reference rows)."""
        fl = self._filled(ex)
        refits = None
        if self.none or fl.numel() == 0:
            pass
        elif self.refit is None:
            self._write_filled(ex, fl)
        else:  # first pass: maps refitted on its exact rows (not row 0, the sink), layer by layer below
            maps, share, rows = self.refit
            pairs = ((ex != 0) if rows is None else torch.isin(ex, rows)).nonzero().flatten()
            alpha = share * fit_count(maps) / pairs.numel()  # each exact row's weight: together ρ·n
            refits = [PromptRefit(maps, self.h[b, ex[pairs]], alpha) for b in range(self.h.shape[0])]
            fitted_w, fitted_b = [], []
        n = self.h.shape[1]
        visible = None
        if self.none:
            visible = torch.zeros(n, dtype=torch.bool, device=self.h.device)
            visible[ex] = True
        x, rope_ex = _rows(self.h, ex, 1), self.rope.rows(ex)
        for i, layer in enumerate(self.late):
            x_in = x
            if refits is not None:
                fitted = [r.layer(i, x_in[b, pairs]) for b, r in enumerate(refits)]
                fitted_w.append(torch.stack([f[0] for f in fitted]).to(self.h.dtype))
                fitted_b.append(torch.stack([f[1] for f in fitted]).to(self.h.dtype))
                self._write_layer(i, layer, fl, ex, (fitted_w[-1], fitted_b[-1]))
            if not self.attention[i]:  # exact rows continue the recurrent state (filled rows advanced it)
                x = self.adapter.layer(layer, x, rope_ex, ex, self.state, None)
                continue
            x = self.adapter.layer(layer, x, rope_ex, ex, self.keys[i], self.values[i], visible=visible)
            for scorer in scorers:
                q = min(scorer.rows, ex.numel())
                scorer.add(layer, x_in[:, -q:], rope_ex.rows(slice(-q, None)), ex[-q:], self.keys[i], visible)
        if refits is not None:  # later passes keep these maps (and the filled rows' K/V written from them)
            self.maps, self.refit = (torch.stack(fitted_w), torch.stack(fitted_b)), None
            self.refitted = self.maps
        return x

    def cache_rows(self, ex: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Per late layer ``[batch, kv_heads, rows, head_dim]`` K/V for the returned cache: every row
        (mode ``"none"``: the exact rows only)."""
        if self.none:
            keys, values = [_rows(k, ex, 2) for k in self.keys], [_rows(v, ex, 2) for v in self.values]
        else:
            keys, values = list(self.keys.unbind(0)), list(self.values.unbind(0))
        for i, att in enumerate(self.attention):  # recurrent layers: their state stands for their cache
            if not att:
                keys[i], values[i] = self.state, None
        return keys, values


def _prefill_exact(model: torch.nn.Module, input_ids: Tensor, ex: Tensor, logits: str) -> PrefillResult:
    """Mode ``"exact"``: the plain ``transformers`` forward; LM head on the requested rows only."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    record_sliding_windows(cache)  # sliding-window layers keep a whole window, so generate_after can crop(-1)
    out = model.get_decoder()(input_ids=input_ids, cache=cache, use_cache=True)
    trim_sliding_windows(out.cache)
    hidden = out.last_hidden_state
    hidden = hidden[:, -1:] if logits == "last" else hidden[:, ex]
    result = model.get_output_embeddings()(hidden)
    _check_finite(result, "the logits of the exact forward")
    return PrefillResult(out.cache, result, ex, None, "exact")


@torch.inference_mode()
def generate_after(model: torch.nn.Module, input_ids: Tensor, result: PrefillResult,
                   max_new_tokens: int) -> Tensor:
    """Greedy continuation from a prefilled cache: every decoding step runs the full model.

    The last prompt row is exact in every mode, so its cache entries are dropped and ``generate``
    recomputes it (identically) as its first step (sliding-window layers keep a whole window for
    that, see :func:`ridgefill.adapters.base.trim_sliding_windows`). ``result.cache`` is consumed: it is cropped and
    then extended by the decoding steps, so call this once per :class:`PrefillResult`.

    Args:
        input_ids: the ``[batch, N]`` int64 prompt that :func:`prefill` returned ``result`` for.
        result: a :class:`PrefillResult` not yet decoded from.
        max_new_tokens: number of tokens to generate, ``≥ 1``.

    Returns:
        ``[batch, max_new_tokens]`` int64 new tokens.

    Raises:
        InputError: ``result`` was already decoded from (prefill again), ``input_ids`` are not the
            prompt ``result`` was prefilled from, ``max_new_tokens`` is not a positive integer, or
            a sliding-window layer's cache is too short to decode from.
    """
    if not isinstance(result, PrefillResult):
        raise InputError(f"result must be the PrefillResult of ridgefill.prefill; got {type(result).__name__}")
    max_new_tokens = check_int(max_new_tokens, "max_new_tokens", lo=1)
    if result.consumed:
        raise InputError("this PrefillResult was already decoded from: generate_after extends its cache in "
                         "place, so a second call would continue from the wrong cache; call prefill again")
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise InputError("input_ids must be the int64 [batch, rows] prompt given to prefill")
    if result.prompt_rows is not None and input_ids.shape[1] != result.prompt_rows:
        raise InputError(f"input_ids have {input_ids.shape[1]} rows but the cache was prefilled from "
                         f"{result.prompt_rows}: pass the same input_ids that prefill was given")
    if result.prompt_sha256 is not None and prompt_digest(input_ids) != result.prompt_sha256:
        raise InputError(f"input_ids {tuple(input_ids.shape)} are not the tokens this cache was prefilled "
                         "from: pass the same input_ids that prefill was given, or prefill these")
    cache = result.cache
    seq = cache.get_seq_length()
    for layer, entry in enumerate(cache.layers):  # sliding-window layers (Gemma 3) need a whole window
        window = getattr(entry, "sliding_window", None)
        if getattr(entry, "is_sliding", False) and entry.keys is not None and entry.keys.shape[-2] < min(seq, window):
            raise InputError(f"cannot decode from this cache: sliding-window layer {layer} holds "
                             f"{entry.keys.shape[-2]} rows, fewer than the min({seq}, {window}) that decoding "
                             "needs. Mode 'none' with tail < sliding_window leaves late sliding layers with the "
                             "exact rows only: use tail >= sliding_window or another mode")
    result.consumed = True
    if any(hasattr(entry, "recurrent_states") for entry in cache.layers):
        return _generate_after_recurrent(model, input_ids, result, max_new_tokens)
    cache.crop(-1)
    out = model.generate(input_ids, cache=cache, max_new_tokens=max_new_tokens, do_sample=False,
                         min_new_tokens=max_new_tokens, pad_token_id=model.config.eos_token_id)
    return out[:, input_ids.shape[1]:]


def _generate_after_recurrent(model: torch.nn.Module, input_ids: Tensor, result: PrefillResult,
                              max_new_tokens: int) -> Tensor:
    """:func:`generate_after` for caches with recurrent states (hybrid models), which cannot be cropped
    by a row: the first new token is the greedy choice from the prefill's own logits of the last
    (exact) row, with end-of-sequence tokens excluded as ``min_new_tokens`` excludes them in
    ``generate``; ``generate`` then continues from the cache, which covers the whole prompt."""
    logits = result.logits[:, -1].clone()
    eos = model.generation_config.eos_token_id
    if eos is not None:
        logits[:, torch.as_tensor(eos, device=logits.device).flatten()] = float("-inf")
    first = logits.argmax(-1, keepdim=True)
    if max_new_tokens <= 1:
        return first[:, :max_new_tokens]
    out = model.generate(torch.cat([input_ids, first], 1), cache=result.cache, max_new_tokens=max_new_tokens - 1,
                         do_sample=False, min_new_tokens=max_new_tokens - 1, pad_token_id=model.config.eos_token_id)
    return out[:, input_ids.shape[1]:]
