"""The fill prefill (paper, "Approach"): exact lower layers, predicted late-layer cache rows.

Data path for a prompt of ``N`` rows, split ``S``, ``L`` layers:

1. A **row plan** (:class:`RowPlan`): the *exact* rows (the last ``tail`` rows, any ``exact_rows``, and the
   rows row selection chooses) run every layer; the others are *filled*.
2. Layers ``0..S`` run exactly on every row (causal attention, as in the plain forward). ``h_S``, the
   output of layer ``S``, is the split state.
3. Row selection (``select``, :mod:`ridgefill.select`) adds rows to the plan: the lexical and
   query-agnostic parts before the late layers, the attention parts after a first pass of the late layers.
4. One step per late layer ``l > S``, by its kind:

   - **attention** (dense or sliding-window): every filled row the layer can read writes the layer's keys
     and values from the prediction ``x̂_l = h_S W_l + b_l`` (:func:`~ridgefill.maps.predict_inputs`; context
     maps read ``[h_S(t), h_S(t−1)]``, :func:`~ridgefill.maps.context_features`), through the layer's own
     input norm, K/V projections and RoPE at the row's true position; then the exact rows run the layer in
     full, attending causally to the mixed cache. In sliding-window layers (Gemma 3) only filled rows some
     exact row can see write K/V (:meth:`~ridgefill.adapters.DecoderAdapter.needed_filled_rows`).
   - **recurrent** (hybrid models): the filled rows advance the layer's conv and delta-rule states from
     their predicted inputs, with no output; the exact rows continue from those states.

   On dense Llama-family models the filled rows' K/V of all late layers are computed at once
   (:meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`: one batched map, the norm folded into the K/V
   weights, RoPE written into the cache).

The result is a standard ``transformers`` cache holding K/V for every row at every layer, so decoding
continues with :func:`generate_after` and every decoding step runs the full model.

Modes (one entry point for the method and its baselines): ``"ridge"`` (the fitted maps), ``"centred"``
(``W_l = I``, ``b_l = x̄_l − h̄_S`` from the calibration means), ``"identity"`` (``W_l = I``, ``b_l = 0``),
``"none"`` (filled rows get no late-layer K/V: exact rows attend to exact rows only there), ``"exact"``
(the plain ``transformers`` forward; the reference).

Lean: ``KvaLean.Causality`` (``filled_causal``, ``lower_layers_exact``, ``exact_rows_exact``,
``no_token_dropped``) and ``KvaLean.Identity.identity_fill_eq`` state the properties of this function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal

import torch
from torch import Tensor
from transformers import DynamicCache

from . import defaults
from .adapters import adapter_for
from .adapters.base import record_sliding_windows, trim_sliding_windows, write_rows
from .errors import InputError, NonFiniteError
from .maps import RidgeMaps, context_features, predict_inputs
from .select import (AttentionScores, Planner, Select, Selection, as_select, as_selection, check_leverage_stats,
                     uses_leverage)
from .validate import binds_prompt, check_choice, check_int, check_rows, prompt_digest

__all__ = ["MODES", "PrefillResult", "RowPlan", "context_features", "exact_positions", "generate_after",
           "predict_inputs", "prefill", "prefill_instrumented"]

Mode = Literal["ridge", "centred", "identity", "none", "exact"]
#: ``kv_hook(layer, keys, values, filled_positions) -> (keys, values)``: see :func:`prefill_instrumented`.
KVHook = Callable[[int, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
MODES: tuple[str, ...] = ("exact", "ridge", "centred", "identity", "none")


@dataclass
class PrefillResult:
    """What :func:`prefill` returns.

    Attributes:
        cache: a ``transformers`` ``DynamicCache`` with K/V for every row at every layer (in mode
            ``"none"``: late layers hold the exact rows only; recurrent layers: their states).
        logits: ``[batch, 1, vocab]`` for the last row (``[batch, E, vocab]`` for every exact row from
            :func:`prefill_instrumented` with ``logits="exact"``), in the model dtype.
        exact_positions: sorted ``int64`` ``[E]``: the rows that ran every layer.
        split: ``S`` (``None`` in mode ``"exact"``).
        mode: the mode used.
        selected: sorted ``int64`` ``[k]``: the rows row selection chose (a subset of ``exact_positions``);
            ``None`` without selection.
        prompt_rows: ``N``, the prompt length; prompt_sha256: :func:`ridgefill.validate.prompt_digest` of its
            ids (:func:`generate_after` refuses other ids).
        consumed: set by :func:`generate_after`, which extends ``cache`` in place: a result decodes once.
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

    @property
    def num_filled(self) -> int:
        """Rows that only wrote late-layer K/V (``0`` in mode ``"exact"``)."""
        return 0 if self.prompt_rows is None or self.mode == "exact" else self.prompt_rows - self.exact_positions.numel()


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


@dataclass(frozen=True)
class RowPlan:
    """Which rows of a prompt run every layer (exact) and which only write late-layer K/V (filled).

    Attributes:
        num_rows: ``N``.
        exact: sorted ``int64`` ``[E]``: the tail, ``exact_rows`` and the chosen rows.
        chosen: sorted ``int64`` ``[k]``: the rows row selection made exact (a subset of ``exact``).
    """

    num_rows: int
    exact: Tensor
    chosen: Tensor

    @property
    def filled(self) -> Tensor:
        """Sorted ``int64`` ``[N − E]``: the rows not in :attr:`exact`."""
        keep = torch.ones(self.num_rows, dtype=torch.bool, device=self.exact.device)
        keep[self.exact] = False
        return keep.nonzero().flatten()


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


def prefill(model: torch.nn.Module, input_ids: Tensor, maps: RidgeMaps | None = None, *,
            tail: int = defaults.TAIL, exact_rows: Iterable[int] = (),
            select: str | Select | Selection | None = defaults.SELECT, mode: Mode = "ridge",
            split: int | None = None, attention_mask: Tensor | None = None) -> PrefillResult:
    """Prefill ``input_ids`` with RidgeFill (or a baseline) and return the cache and last-row logits.

    Args:
        model: a causal LM with an adapter (:func:`ridgefill.adapters.supported_model_types`), in eval mode.
        input_ids: ``[batch, N]`` int64 token ids: one prompt, or a batch of prompts of one length without
            padding (the batch shares one row plan; docs/method.md, "Batches"). A batch whose rows differ in
            starting or ending with the model's pad token is refused as padded.
        attention_mask: ``None``, or the tokenizer's ``[batch, N]`` mask, accepted only when it is all ones:
            a padded batch is refused, not masked.
        maps: fitted maps (:func:`ridgefill.load_maps`), needed by modes ``"ridge"`` and ``"centred"``;
            checked against ``model`` and ``split``.
        tail: rows at the end of the prompt that run the full model (``1 ≤ tail ≤ N``; default 256).
        exact_rows: further absolute positions that run the full model.
        select: row selection (:mod:`ridgefill.select`): ``"on"`` (the default, query-aware: the question
            must be in the tail), ``"prompt"`` (query-agnostic), ``"off"``/``None``, a spec string of
            :meth:`~ridgefill.select.Select.parse`, or a :class:`~ridgefill.select.Select` /
            :class:`~ridgefill.select.Selection`. Ignored in mode ``"exact"``, where every row is exact.
        mode: ``"ridge"`` (default), ``"centred"``, ``"identity"``, ``"none"`` or ``"exact"`` (module docstring).
        split: ``S`` (``0 ≤ S ≤ L-2``); defaults to ``maps.split``; required for identity/none without maps.

    Returns:
        :class:`PrefillResult`: the cache equals that of a one-pass fill with the chosen rows given as
        ``exact_rows`` (up to float rounding).

    Raises:
        InputError: a bad type, shape or value of an argument (checked before any layer runs); a padded
            batch (a mask with zeros, or rows that start or end with the pad token where others do not); a
            selection with attention parts in mode ``"none"``; on models with recurrent-state layers, exact rows outside
            the tail, row selection or K/V maps (pass ``select="off"``).
        MapsMismatchError: ``maps`` belong to another model or split.
        NonFiniteError: NaN/Inf activations.
    """
    return prefill_instrumented(model, input_ids, maps, tail=tail, exact_rows=exact_rows, select=select, mode=mode,
                                split=split, attention_mask=attention_mask)


@binds_prompt
@torch.inference_mode()
def prefill_instrumented(model: torch.nn.Module, input_ids: Tensor, maps: RidgeMaps | None = None, *,
                         tail: int = defaults.TAIL, exact_rows: Iterable[int] = (),
                         select: str | Select | Selection | None = defaults.SELECT, mode: Mode = "ridge",
                         split: int | None = None, logits: Literal["last", "exact"] = "last",
                         kv_hook: KVHook | None = None, fast: bool = True,
                         attention_mask: Tensor | None = None) -> PrefillResult:
    """:func:`prefill` with the evaluation's instruments (the splice tests, NLL over the exact rows, the
    reference path). The arguments :func:`prefill` takes mean the same here.

    Args:
        logits: ``"last"`` for the last row only, ``"exact"`` for every exact row (chosen rows included).
        kv_hook: in the fill modes, for each late attention layer ``l``, called as ``kv_hook(l, k, v, filled)``
            with the filled rows' predicted keys (after RoPE) and values ``[batch, kv_heads, rows, head_dim]``
            and their positions ``filled`` ``[rows]`` before any exact row reads them (in sliding-window layers
            only the rows some exact row sees); returns the ``(k, v)`` to write instead (same shapes).
            :mod:`ridgefill.evaluate.splice` uses it.
        fast: compute the filled rows' K/V of all late layers in one batched step
            (:meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`) where the adapter has it, there is no
            ``kv_hook`` and every late layer reads every filled row; ``False`` takes the per-layer path (the
            reference the fast path is tested against; equal up to float rounding).

    Raises:
        InputError: as :func:`prefill`; ``logits`` other than ``"last"``/``"exact"``; ``kv_hook`` not callable
            or on a model with recurrent-state layers.
    """
    check_choice(mode, "mode", MODES)
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.shape[1] < 1 \
            or input_ids.dtype != torch.long:
        got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise InputError(f"input_ids must be an int64 tensor [batch, rows]; got {got}")
    select = None if mode == "exact" else as_select(select)
    if select is not None and mode == "none" and as_selection(select).rounds:
        raise InputError(f"select {select} has attention parts, which score the filled rows' late-layer K/V; mode "
                         "'none' writes none: pass select='off' (or make every part by='leverage' or 'ngram')")
    vocab = model.get_input_embeddings().num_embeddings
    if input_ids.numel() == 0 or int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        got = "no rows" if input_ids.numel() == 0 else f"ids in {int(input_ids.min())}..{int(input_ids.max())}"
        raise InputError(f"input_ids must be token ids in 0..{vocab - 1} (this model's vocabulary) with at least "
                         f"one batch row; got {got}: tokenize with this model's tokenizer")
    _check_unpadded(model, input_ids, attention_mask)
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
    elif split is None:
        split = maps.split if maps is not None else None
    if split is None or not 0 <= split <= L - 2:
        raise InputError(f"split S={split} is out of range: this model has {L} layers, so 0 ≤ S ≤ {L - 2} "
                         "(at least one late layer)")
    recurrent = adapter.recurrent_layers  # hybrid models: layers with a recurrent state, not K/V
    if recurrent:
        adapter.check_exact_rows(n, ex)
        if kv_hook is not None or select is not None or (mode == "ridge" and maps.kind != "inputs"):
            raise InputError(f"this model has recurrent-state layers ({list(recurrent)}): row selection, kv_hook "
                             "(splice tests) and K/V maps cover attention layers only; pass select='off' "
                             "(--select off) and use input maps")
    if uses_leverage(select):  # the query-agnostic part scores with the calibration covariance
        check_leverage_stats(select, maps)
        maps.check_model(model, split)

    device = input_ids.device
    plan = RowPlan(n, ex, torch.zeros(0, dtype=torch.long, device=device))
    positions = torch.arange(n, device=device)
    x = adapter.embed(input_ids)
    rope = adapter.rope(positions, x)
    keys, values = [], []
    state = adapter.new_state() if recurrent else None  # recurrent layers' states, in keys[l] (values[l] None)
    for layer in range(split + 1):  # lower layers: every row, exactly
        if layer in recurrent:
            k, v = state, None
        else:
            shape = (x.shape[0], adapter.num_kv_heads, n, adapter.head_dim)
            k, v = x.new_empty(shape), x.new_empty(shape)
        x = adapter.layer(layer, x, rope, positions, k, v)
        keys.append(k)
        values.append(v)
    _check_finite(x, f"the split state h_S (output of layer {split})")

    kind = maps.kind if mode == "ridge" else "inputs"
    feats = context_features(x, maps.context) if mode == "ridge" else x  # the maps' input rows
    late = _LateLayers(adapter, range(split + 1, L), x, feats, rope, _fill_maps(mode, maps, x), kv_hook,
                       batched=fast and kv_hook is None and kind == "inputs", none=mode == "none", kind=kind,
                       state=state)
    planner = Planner(as_selection(select), n, device) if select is not None else None
    exact = plan.exact
    if planner is not None:
        exact = planner.up_front(input_ids, x, maps, tail, exact)
    rounds = planner.rounds if planner is not None else 0
    ran, scorers = None, {}
    for r in range(rounds + 1):  # a first pass; after each round of the attention parts, a pass if rows changed
        if ran is None or not torch.equal(ran, exact):
            scorers = planner.scorers(adapter, r) if planner is not None else {}
            out, ran = late.run(exact, list(scorers.values())), exact
        if r < rounds:
            exact = planner.after_pass(r, scorers, exact)
    plan = RowPlan(n, exact, planner.chosen if planner is not None else plan.chosen)

    result = adapter.logits(out[:, -1:] if logits == "last" else out)
    _check_finite(result, "the logits of the exact rows")
    late_k, late_v = late.cache_rows(plan.exact)
    cache = adapter.build_cache(keys + late_k, values + late_v)
    return PrefillResult(cache, result, plan.exact, split, mode, plan.chosen if planner is not None else None)


def _pad_id(model: torch.nn.Module) -> int | None:
    """The model's pad token id (config, else generation config), or ``None``."""
    for cfg in (model.config, getattr(model, "generation_config", None)):
        pad = getattr(cfg, "pad_token_id", None)
        if isinstance(pad, int) and not isinstance(pad, bool):
            return pad
    return None


def _check_unpadded(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None) -> None:
    """Refuse a padded batch: ``attention_mask`` with a zero, or rows that start (left padding) or end (right
    padding) with the pad token where other rows do not. The fill has no mask: its exact rows, its filled
    rows and a hybrid model's recurrent states would all take the pads in (docs/method.md, "Batches")."""
    fix = ("prefill takes no attention mask: give one prompt, or a batch of prompts of one length without "
           "padding; prefill prompts of other lengths one at a time")
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise InputError(f"attention_mask must be a tensor of the shape of input_ids {tuple(input_ids.shape)}; "
                             f"got {got}")
        pads = (attention_mask == 0).sum(1)
        if bool(pads.any()):
            rows = pads.nonzero().flatten().tolist()
            raise InputError(f"the batch is padded: attention_mask masks {int(pads.sum())} position(s) in row(s) "
                             f"{rows[:8]}; {fix}")
    pad = _pad_id(model)
    if pad is None or input_ids.shape[0] < 2:
        return
    for side, col in (("start", 0), ("end", -1)):
        hit = input_ids[:, col] == pad
        if bool(hit.any()) and not bool(hit.all()):
            rows = hit.nonzero().flatten().tolist()
            raise InputError(f"the batch looks padded: row(s) {rows[:8]} {side} with the pad token {pad} and other "
                             f"rows do not ({'left' if col == 0 else 'right'} padding); {fix}")


def _fill_maps(mode: str, maps: RidgeMaps | None, like: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(W [late, f, k], b [late, k])`` in the dtype/device of ``like`` for the mode, or ``None`` for
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


class _LateLayers:
    """The late layers ``S+1..L-1`` of one prefill: one step per layer, by its kind.

    :meth:`run` runs the exact rows through every late layer. Before the exact rows run an attention
    layer, every filled row that layer can read has its K/V (computed once per row and layer, from
    ``h_S`` through the maps); before they run a recurrent layer, the filled rows have advanced its
    state (once). Calling :meth:`run` again with more exact rows (row selection) recomputes only the
    late layers of the exact rows; rows that became exact overwrite their predicted K/V with exact ones.
    """

    def __init__(self, adapter, late: range, h: Tensor, feats: Tensor, rope, maps: tuple[Tensor, Tensor] | None,
                 kv_hook: KVHook | None, *, batched: bool, none: bool, kind: str = "inputs", state=None):
        self.adapter, self.late, self.h, self.feats, self.rope = adapter, late, h, feats, rope
        self.maps, self.kv_hook, self.batched, self.none, self.kind = maps, kv_hook, batched, none, kind
        self.state = state  # recurrent layers' conv and delta-rule states (hybrid models), else None
        self.attention = [layer not in adapter.recurrent_layers for layer in late]
        b, n = h.shape[0], h.shape[1]
        shape = (len(late), b, adapter.num_kv_heads, n, adapter.head_dim)
        self.keys, self.values = h.new_zeros(shape), h.new_zeros(shape)
        self.have = torch.zeros(len(late), n, dtype=torch.bool, device=h.device)  # rows holding K/V (or state)

    def run(self, exact: Tensor, scorers: list[AttentionScores] = ()) -> Tensor:
        """Run the exact rows (sorted ``int64`` ``[E]``) through the late layers; returns their output of
        the last layer ``[batch, E, d]``. Each of ``scorers`` records the attention of its last
        ``scorer.rows`` exact rows (query and reference rows)."""
        n = self.h.shape[1]
        keep = torch.ones(n, dtype=torch.bool, device=self.h.device)
        keep[exact] = False
        filled = keep.nonzero().flatten()
        write = not self.none and filled.numel() > 0
        if write and self._can_batch(filled, exact):
            self._fill_batched(filled)
            write = False  # every late layer's filled rows hold their K/V now
        visible = None  # mode "none": late layers read the exact rows only
        if self.none:
            visible = torch.zeros(n, dtype=torch.bool, device=self.h.device)
            visible[exact] = True
        x, rope_ex = _rows(self.h, exact, 1), self.rope.rows(exact)
        for i, layer in enumerate(self.late):
            if self.attention[i]:
                if write:
                    self._write_filled_kv(i, layer, filled, exact)
                x_in = x
                x = self.adapter.layer(layer, x, rope_ex, exact, self.keys[i], self.values[i], visible=visible)
                for scorer in scorers:
                    q = min(scorer.rows, exact.numel())
                    scorer.add(layer, x_in[:, -q:], rope_ex.rows(slice(-q, None)), exact[-q:], self.keys[i], visible)
            else:
                if write:
                    self._advance_state(i, layer, filled)
                x = self.adapter.layer(layer, x, rope_ex, exact, self.state, None)
        return x

    def _predicted(self, i: int, rows: Tensor) -> Tensor:
        """``x̂`` of late layer ``i`` for ``rows``: ``h_S W + b`` (or ``h_S`` itself for the identity fill)."""
        if self.maps is None:
            return _rows(self.h, rows, 1)
        return predict_inputs(_rows(self.feats, rows, 1), self.maps[0][i], self.maps[1][i])

    def _can_batch(self, filled: Tensor, exact: Tensor) -> bool:
        ad = self.adapter
        return (self.batched and not self.have.any() and all(self.attention) and hasattr(ad, "fill_kv")
                and ad.supports_fill_kv()
                and all(ad.needed_filled_rows(layer, filled, exact) is None for layer in self.late))

    def _fill_batched(self, filled: Tensor) -> None:
        """Every late layer's filled-row K/V at once (:meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`)."""
        first, count = int(filled[0]), filled.numel()
        contiguous = int(filled[-1]) - first + 1 == count
        if contiguous:
            outs = self.keys.narrow(3, first, count), self.values.narrow(3, first, count)
        else:
            shape = self.keys.shape[:3] + (count, self.keys.shape[4])
            outs = self.h.new_empty(shape), self.h.new_empty(shape)
        w, b = self.maps if self.maps is not None else (None, None)
        self.adapter.fill_kv(self.late, _rows(self.h if w is None else self.feats, filled, 1), w, b,
                             self.rope.rows(filled), *outs)
        if not contiguous:
            self.keys.index_copy_(3, filled, outs[0])
            self.values.index_copy_(3, filled, outs[1])
        self.have[:, filled] = True

    def _write_filled_kv(self, i: int, layer: int, filled: Tensor, exact: Tensor) -> None:
        """Attention layer ``layer`` (index ``i``): the filled rows it can read that lack K/V write them."""
        ad = self.adapter
        need = ad.needed_filled_rows(layer, filled, exact)
        rows = filled if need is None else filled[need]
        rows = rows[~self.have[i, rows]]
        if rows.numel() == 0:
            return
        x_hat = self._predicted(i, rows)
        if self.kind == "kv":  # K/V maps predict the pre-RoPE keys and values themselves
            kf, vf = ad.kv_from_targets(layer, x_hat, self.rope.rows(rows))
        else:
            kf, vf = ad.kv(layer, x_hat, self.rope.rows(rows))
        if self.kv_hook is not None:
            kf, vf = self.kv_hook(layer, kf, vf, rows)
        write_rows(self.keys[i], self.values[i], rows, kf, vf)
        self.have[i, rows] = True

    def _advance_state(self, i: int, layer: int, filled: Tensor) -> None:
        """Recurrent layer ``layer`` (index ``i``): the filled rows advance its state from their predicted
        inputs, once, before any exact row runs it."""
        if not self.have[i].any():
            self.adapter.advance_state(layer, self._predicted(i, filled), self.state)
            self.have[i, filled] = True

    def cache_rows(self, exact: Tensor) -> tuple[list, list]:
        """Per late layer ``[batch, kv_heads, rows, head_dim]`` K/V for the returned cache: every row
        (mode ``"none"``: the exact rows only); a recurrent layer's state stands for its cache."""
        if self.none:
            keys, values = [_rows(k, exact, 2) for k in self.keys], [_rows(v, exact, 2) for v in self.values]
        else:
            keys, values = list(self.keys.unbind(0)), list(self.values.unbind(0))
        for i, att in enumerate(self.attention):
            if not att:
                keys[i], values[i] = self.state, None
        return keys, values


def _prefill_exact(model: torch.nn.Module, input_ids: Tensor, ex: Tensor, logits: str) -> PrefillResult:
    """Mode ``"exact"``: the plain ``transformers`` forward; LM head on the requested rows only."""
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
