"""The fill prefill (paper, "Approach"): exact lower layers, predicted late-layer cache rows.

Data path for a prompt of ``N`` rows, split ``S``, ``L`` layers:

1. A **row plan** (:class:`RowPlan`): the *exact* rows (the last ``tail`` rows, any ``exact_rows``, and the
   rows row selection chooses) run every layer; the others are *filled*.
2. Layers ``0..S`` run exactly on every row (causal attention, as in the plain forward). ``h_S``, the
   output of layer ``S``, is the split state.
3. Row selection (``select``, :mod:`ridgefill.select`) adds rows to the plan: the lexical, query-agnostic and
   one-pass parts (``by="predicted"``, the default's) before the late layers, the two-pass attention parts after
   a first pass of the late layers.
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

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from . import defaults
from .adapters import adapter_for
from .adapters.base import record_sliding_windows, trim_sliding_windows, write_rows
from .errors import InputError, NonFiniteError
from .maps import RidgeMaps, context_features, context_rows, predict_inputs
from .select import (AttentionScores, Planner, Select, Selection, as_selection, check_leverage_stats,
                     leverage_scores, read_scores, resolve_auto, runs_on_recurrent, uses_leverage)
from .validate import check_choice, check_int, check_rows, prompt_digest

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
    """Sorted unique positions that run the full model: the last ``tail`` rows plus ``exact_rows``
    (``int64`` on the host).

    Raises:
        InputError: ``tail`` outside ``1..num_rows``, or an exact row outside ``0..num_rows-1``.
    """
    if not 1 <= tail <= num_rows:
        raise InputError(f"tail={tail} must be between 1 and the prompt length {num_rows}: the last row "
                         "must be exact, and the tail cannot be longer than the prompt (use mode='exact' "
                         "to run every row exactly)")
    rows = np.asarray(list(exact_rows), dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise InputError(f"exact_rows must lie in 0..{num_rows - 1}; got {rows.tolist()}")
    return torch.from_numpy(np.union1d(rows, np.arange(num_rows - tail, num_rows)))


@dataclass(frozen=True)
class RowPlan:
    """Which rows of a prompt run every layer (exact) and which only write late-layer K/V (filled). Host
    arrays: the plan is decided on the host, so the late layers' shapes never wait for the device.

    Attributes:
        num_rows: ``N``.
        exact: sorted ``int64`` ``[E]``: the tail, ``exact_rows`` and the chosen rows.
        chosen: sorted ``int64`` ``[k]``: the rows row selection made exact (a subset of ``exact``).
    """

    num_rows: int
    exact: np.ndarray
    chosen: np.ndarray

    @property
    def filled(self) -> np.ndarray:
        """Sorted ``int64`` ``[N − E]``: the rows not in :attr:`exact`."""
        return np.setdiff1d(np.arange(self.num_rows), self.exact, assume_unique=True)


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """The sorted host ``rows`` as maximal runs of consecutive positions ``[(start, stop), ...]``."""
    if rows.size == 0:
        return []
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(rows, cut)]


def _segments(exact: np.ndarray, n: int) -> list[tuple[int, int, bool]]:
    """Positions ``0..n-1`` as maximal runs ``[(start, stop, is_exact), ...]`` in order, ``exact`` the sorted
    host exact rows."""
    out, at = [], 0
    for start, stop in _runs(exact):
        if start > at:
            out.append((at, start, False))
        out.append((start, stop, True))
        at = stop
    if at < n:
        out.append((at, n, False))
    return out


def _rows(x: Tensor, host: np.ndarray, index: Tensor, dim: int) -> Tensor:
    """``x`` restricted to the rows ``index`` (device) along ``dim``, ``host`` the same rows on the host: a
    view when they are one run of consecutive positions."""
    n = host.size
    if n and int(host[-1]) - int(host[0]) == n - 1:
        return x.narrow(dim, int(host[0]), n)
    return x.index_select(dim, index)


def _on(device: torch.device, rows: np.ndarray) -> Tensor:
    """Host ``int64`` rows as a device index tensor (pinned and asynchronous where the device is an accelerator)."""
    t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    if device.type == "cpu":
        return t
    return (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)


def _check_finite(flags: list[bool], where: list[str]) -> None:
    """Raise :class:`NonFiniteError` for the first ``False`` of ``flags`` (read from the device at once)."""
    for ok, place in zip(flags, where):
        if not ok:
            raise NonFiniteError(f"NaN or Inf in the activations at {place}; check the model weights, the "
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
        select: row selection (:mod:`ridgefill.select`): ``"auto"`` (the default: the setting the maps record,
            :attr:`~ridgefill.maps.RidgeMaps.select`, else ``"on"``; ``"two-pass"`` with K/V maps), ``"on"``
            (query-aware, one pass: the question must be in the tail; :data:`~ridgefill.select.DEFAULT_SELECT`),
            ``"one-pass"`` (the same), ``"two-pass"`` (the attention parts scored in a first pass of the late layers),
            ``"prompt"`` (query-agnostic), ``"off"``/``None``, a spec string of
            :meth:`~ridgefill.select.Select.parse`, or a :class:`~ridgefill.select.Select` /
            :class:`~ridgefill.select.Selection`. Ignored in mode ``"exact"``, where every row is exact. The
            plan is decided on the host: a prefill reads the device a constant number of times (the prompt,
            the scores of each selection round, the finiteness checks; ``tests/test_syncs.py``).
        mode: ``"ridge"`` (default), ``"centred"``, ``"identity"``, ``"none"`` or ``"exact"`` (module docstring).
        split: ``S`` (``0 ≤ S ≤ L-2``); defaults to ``maps.split``; required for identity/none without maps.

    Returns:
        :class:`PrefillResult`: the cache equals that of a one-pass fill with the chosen rows given as
        ``exact_rows`` (up to float rounding).

    Raises:
        InputError: a bad type, shape or value of an argument (checked before any layer runs); a padded
            batch (a mask with zeros, or rows that start or end with the pad token where others do not); a
            selection with attention parts in mode ``"none"``; one-pass parts with K/V maps; on models with
            recurrent-state layers, exact rows outside the tail, row selection or K/V maps (pass ``select="off"``).
        MapsMismatchError: ``maps`` belong to another model or split.
        NonFiniteError: NaN/Inf activations.
    """
    return prefill_instrumented(model, input_ids, maps, tail=tail, exact_rows=exact_rows, select=select, mode=mode,
                                split=split, attention_mask=attention_mask)


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
        fast: compute the filled rows' K/V with :meth:`~ridgefill.adapters.LlamaAdapter.fill_kv` (norm folded
            into the K/V weights, RoPE written into the cache) where the adapter has it, there is no ``kv_hook``
            and every late layer reads every filled row; ``False`` takes the per-layer path (the reference the
            fast path is tested against; equal up to float rounding).

    Raises:
        InputError: as :func:`prefill`; ``logits`` other than ``"last"``/``"exact"``; ``kv_hook`` not callable
            or on a model with recurrent-state layers.
    """
    check_choice(mode, "mode", MODES)
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.shape[1] < 1 \
            or input_ids.dtype != torch.long:
        got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise InputError(f"input_ids must be an int64 tensor [batch, rows]; got {got}")
    if maps is not None and not isinstance(maps, RidgeMaps):
        raise InputError(f"maps must be a RidgeMaps (ridgefill.load_maps) or None; got {type(maps).__name__}")
    select = None if mode == "exact" else resolve_select(select, maps, bool(adapter_for(model).recurrent_layers), mode)
    if select is not None and mode == "none" and any(p.by in ("attention", "predicted") for p in as_selection(select).parts):
        raise InputError(f"select {select} has attention parts, which score the filled rows' late-layer K/V; mode "
                         "'none' writes none: pass select='off' (or make every part by='leverage' or 'ngram')")
    ids = input_ids.cpu().numpy()  # the one read of the prompt: checks, the digest and the lexical part use it
    vocab = model.get_input_embeddings().num_embeddings
    if ids.size == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab:
        got = "no rows" if ids.size == 0 else f"ids in {int(ids.min())}..{int(ids.max())}"
        raise InputError(f"input_ids must be token ids in 0..{vocab - 1} (this model's vocabulary) with at least "
                         f"one batch row; got {got}: tokenize with this model's tokenizer")
    _check_unpadded(model, ids, attention_mask)
    n = ids.shape[1]
    tail = check_int(tail, "tail", lo=1, hi=n, hint="the last row must be exact and the tail cannot be longer than "
              "the prompt (use mode='exact' to run every row exactly)")
    exact_rows = check_rows(exact_rows, "exact_rows", n)
    check_choice(logits, "logits", ("last", "exact"))
    if split is not None:
        split = check_int(split, "split", lo=0)
    if kv_hook is not None and not callable(kv_hook):
        raise InputError(f"kv_hook must be callable or None; got {type(kv_hook).__name__}")
    ex = exact_positions(n, tail, exact_rows).numpy()
    if mode == "exact":
        return _bind(_prefill_exact(model, input_ids, _on(input_ids.device, ex), logits), ex, ids)

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
        if kv_hook is not None or (mode == "ridge" and maps.kind != "inputs"):
            raise InputError(f"this model has recurrent-state layers ({list(recurrent)}): kv_hook (splice tests) "
                             "and K/V maps cover attention layers only; use input maps")
        if not runs_on_recurrent(select):
            raise InputError(f"this model has recurrent-state layers ({list(recurrent)}), whose state advances once "
                             f"over the rows in order, so rows cannot become exact after a first pass: select "
                             f"{select} has attention parts scored after one; use the one-pass selection "
                             "(select='one-pass', or 'auto'), or select='off'")
    if uses_leverage(select):  # the query-agnostic part scores with the calibration covariance
        check_leverage_stats(select, maps)
        maps.check_model(model, split)
    kind = maps.kind if mode == "ridge" else "inputs"
    if select is not None and kind != "inputs" and any(p.by == "predicted" for p in as_selection(select).parts):
        raise InputError(f"select {select} has one-pass parts (by='predicted'), which score with the late layers' "
                         "predicted queries; K/V maps predict keys and values only: use input maps, or the "
                         "two-pass selection (--select two-pass)")

    device = input_ids.device
    positions = torch.arange(n, device=device)
    every = np.arange(n)
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
        x = adapter.layer(layer, x, rope, positions, k, v, host=every)
        keys.append(k)
        values.append(v)
    finite = [torch.isfinite(x).all()]  # read with the logits' check, at the end

    context = maps.context if mode == "ridge" else 0
    late = _LateLayers(adapter, range(split + 1, L), x, rope, _fill_maps(mode, maps, x), context, kv_hook,
                       fast=fast and kv_hook is None and kind == "inputs", none=mode == "none", kind=kind,
                       state=state)
    exact, chosen = ex, np.zeros(0, dtype=np.int64)
    if select is not None:
        planner = Planner(as_selection(select), n)
        induction = maps.induction if maps is not None else None
        exact = planner.up_front(ids, tail, exact, read_scores(late.up_front_scores(planner, maps, exact, induction)))
        out, exact = late.select_passes(planner, exact, induction)
        chosen = planner.chosen
    else:
        out = late.run(exact)

    result = adapter.logits(out[:, -1:] if logits == "last" else out)
    finite.append(torch.isfinite(result).all())
    _check_finite(torch.stack(finite).tolist(), [f"the split state h_S (output of layer {split})",
                                                 "the logits of the exact rows"])
    late_k, late_v = late.cache_rows(exact)
    cache = adapter.build_cache(keys + late_k, values + late_v)
    return _bind(PrefillResult(cache, result, torch.from_numpy(exact), split, mode,
                               torch.from_numpy(chosen) if select is not None else None), exact, ids)


def _bind(result: PrefillResult, exact: np.ndarray, ids: np.ndarray) -> PrefillResult:
    """Record on ``result`` the prompt it was computed from (``prompt_rows``, ``prompt_sha256``), so that
    :func:`generate_after` can refuse another prompt."""
    result.prompt_rows = int(ids.shape[1])
    result.prompt_sha256 = prompt_digest(ids)
    return result


def resolve_select(select, maps: RidgeMaps | None, recurrent: bool = False, mode: str = "ridge"):
    """``select`` as :func:`prefill` reads it: ``"auto"`` is the setting recorded in ``maps`` (``ridgefill tune``
    writes it, :attr:`RidgeMaps.select`), else ``"on"`` (one pass), or ``"two-pass"`` where mode ``"ridge"`` reads
    K/V maps, or ``"one-pass"`` on a model with recurrent-state layers (``recurrent``); anything else as
    :func:`~ridgefill.select.as_select` (:func:`~ridgefill.select.resolve_auto`)."""
    inputs = mode != "ridge" or maps is None or maps.kind == "inputs"
    return resolve_auto(select, maps.select if maps is not None else None, recurrent, inputs)


def _pad_id(model: torch.nn.Module) -> int | None:
    """The model's pad token id (config, else generation config), or ``None``."""
    for cfg in (model.config, getattr(model, "generation_config", None)):
        pad = getattr(cfg, "pad_token_id", None)
        if isinstance(pad, int) and not isinstance(pad, bool):
            return pad
    return None


def _check_unpadded(model: torch.nn.Module, ids: np.ndarray, attention_mask: Tensor | None) -> None:
    """Refuse a padded batch (``ids``: the host copy of ``input_ids``): ``attention_mask`` with a zero, or rows
    that start (left padding) or end (right padding) with the pad token where other rows do not. The fill has
    no mask: its exact rows, its filled rows and a hybrid model's recurrent states would all take the pads in
    (docs/method.md, "Batches")."""
    fix = ("prefill takes no attention mask: give one prompt, or a batch of prompts of one length without "
           "padding; prefill prompts of other lengths one at a time")
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise InputError(f"attention_mask must be a tensor of the shape of input_ids {tuple(ids.shape)}; "
                             f"got {got}")
        pads = (attention_mask.cpu().numpy() == 0).sum(1)
        if pads.any():
            rows = np.flatnonzero(pads).tolist()
            raise InputError(f"the batch is padded: attention_mask masks {int(pads.sum())} position(s) in row(s) "
                             f"{rows[:8]}; {fix}")
    pad = _pad_id(model)
    if pad is None or ids.shape[0] < 2:
        return
    for side, col in (("start", 0), ("end", -1)):
        hit = ids[:, col] == pad
        if hit.any() and not hit.all():
            rows = np.flatnonzero(hit).tolist()
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
    """The late layers ``S+1..L-1`` of one prefill: one step per layer, by its kind, over a host row plan.

    :meth:`run` runs the exact rows through the late layers. Before the exact rows run an attention
    layer, every filled row that layer can read has its K/V (computed once per row and layer, from
    ``h_S`` through the maps, :meth:`fill`); before they run a recurrent layer, the filled rows have advanced
    its state (once). Calling :meth:`run` again with more exact rows (row selection) recomputes only the
    late layers of the exact rows; rows that became exact overwrite their predicted K/V with exact ones.
    Which rows run is decided on the host (:class:`RowPlan`): no step reads the device to size its work.
    """

    def __init__(self, adapter, late: range, h: Tensor, rope, maps: tuple[Tensor, Tensor] | None, context: int,
                 kv_hook: KVHook | None, *, fast: bool, none: bool, kind: str = "inputs", state=None):
        self.adapter, self.late, self.h, self.rope, self.context = adapter, late, h, rope, context
        self.maps, self.kv_hook, self.none, self.kind = maps, kv_hook, none, kind
        self.state = state  # recurrent layers' conv and delta-rule states (hybrid models), else None
        self.attention = [layer not in adapter.recurrent_layers for layer in late]
        self.fast = fast and all(self.attention) and hasattr(adapter, "fill_kv") and adapter.supports_fill_kv()
        sliding = any(getattr(adapter, "is_sliding", lambda _: False)(layer) for layer in late)
        b, n = h.shape[0], h.shape[1]
        shape = (b, adapter.num_kv_heads, n, adapter.head_dim)
        # every position is written before it is read on the fast path without sliding windows; elsewhere rows
        # no exact row reads (mode "none", outside a window) stay zero, and a masked key must not be NaN
        new = h.new_empty if self.fast and not (none or sliding) else h.new_zeros
        self.keys = [new(shape) if att else None for att in self.attention]
        self.values = [new(shape) if att else None for att in self.attention]
        self.have = np.zeros((len(late), n), dtype=bool)  # rows holding K/V
        self.advanced: set[int] = set()  # recurrent late layers whose state has advanced over the prompt
        self.device = h.device

    def _predicted(self, i: int, rows: Tensor) -> Tensor:
        """``x̂`` of late layer ``i`` for ``rows`` (device index): ``f W + b`` with ``f`` the rows' map inputs
        (:func:`~ridgefill.maps.context_rows`), or ``h_S`` itself for the identity fill."""
        if self.maps is None:
            return self.h.index_select(1, rows)
        return predict_inputs(context_rows(self.h, rows, self.context), self.maps[0][i], self.maps[1][i])

    def fill(self, rows: np.ndarray, exact: np.ndarray) -> None:
        """Predicted K/V of the host ``rows`` (sorted) in every attention layer that can read them (``exact``:
        the rows that read them), where not written yet."""
        if rows.size == 0 or self.none:
            return
        ad = self.adapter
        if self.fast and all(ad.needed_filled_rows(layer, rows, exact) is None for layer in self.late):
            lack = rows[~self.have[0, rows]]
            w, b = self.maps if self.maps is not None else (None, None)
            for start, stop in _runs(lack):
                self.adapter.fill_kv(self.late, self.h, w, b, self.rope.rows(slice(start, stop)), self.keys,
                                     self.values, start, stop)
            self.have[:, lack] = True
            return
        for i, layer in enumerate(self.late):
            if not self.attention[i]:
                continue
            need = ad.needed_filled_rows(layer, rows, exact)
            sub = rows if need is None else rows[need]
            sub = sub[~self.have[i, sub]]
            if sub.size == 0:
                continue
            index = _on(self.device, sub)
            x_hat = self._predicted(i, index)
            rope = self.rope.rows(index)
            if self.kind == "kv":  # K/V maps predict the pre-RoPE keys and values themselves
                kf, vf = ad.kv_from_targets(layer, x_hat, rope)
            else:
                kf, vf = ad.kv(layer, x_hat, rope)
            if self.kv_hook is not None:
                kf, vf = self.kv_hook(layer, kf, vf, index)
            write_rows(self.keys[i], self.values[i], index, kf, vf)
            self.have[i, sub] = True

    def run(self, exact: np.ndarray, scorers=(), start: int = 0, stop: int | None = None,
            x: Tensor | None = None) -> Tensor:
        """Run the exact rows (sorted host ``int64`` ``[E]``) through late layers ``start .. stop-1`` (indices
        into the late layers; all by default), from ``x`` (their input of layer ``start``; ``h_S`` of the rows
        when ``None``); returns their output ``[batch, E, d]``. Each of ``scorers`` records the attention of
        its last ``scorer.rows`` exact rows."""
        n = self.h.shape[1]
        stop = len(self.late) if stop is None else stop
        filled = np.setdiff1d(np.arange(n), exact, assume_unique=True)
        self.fill(filled, exact)
        index = _on(self.device, exact)
        visible = None  # mode "none": late layers read the exact rows only
        if self.none:
            visible = torch.zeros(n, dtype=torch.bool, device=self.device)
            visible[index] = True
        if x is None:
            x = _rows(self.h, exact, index, 1)
        rope = self.rope.rows(slice(int(exact[0]), int(exact[-1]) + 1) if exact[-1] - exact[0] == exact.size - 1
                              else index)
        for i in range(start, stop):
            layer = self.late[i]
            if not self.attention[i]:
                x = self._recurrent(i, x, exact, filled, rope, index)
                continue
            x_in = x
            x = self.adapter.layer(layer, x, rope, index, self.keys[i], self.values[i], visible=visible, host=exact)
            for scorer in scorers:
                q = min(scorer.rows, exact.size)
                scorer.add(layer, x_in[:, -q:], rope.rows(slice(-q, None)), index[-q:], self.keys[i], visible,
                           host=exact[-q:])
        return x

    def _recurrent(self, i: int, x: Tensor, exact: np.ndarray, filled: np.ndarray, rope, index: Tensor) -> Tensor:
        """Recurrent late layer ``i``: its state advances once over the rows in order, a run of filled rows
        from their predicted inputs (mode ``"none"``: not at all), a run of exact rows (input ``x``, their
        slice of ``[batch, E, d]``) through the layer, whose outputs are returned ``[batch, E, d]``."""
        layer, ad = self.late[i], self.adapter
        if i in self.advanced:
            raise InputError(f"recurrent-state layer {layer} already advanced over the prompt: its rows cannot run "
                             "again (use one-pass selection)")
        self.advanced.add(i)
        if self.none or filled.size == 0 or filled[-1] < exact[0]:  # the filled rows (if any) come first
            if filled.size and not self.none:
                ad.advance_state(layer, self._predicted(i, _on(self.device, filled)), self.state)
            return ad.layer(layer, x, rope, index, self.state, None, host=exact)
        out, j = [], 0
        for start, stop, is_exact in _segments(exact, self.h.shape[1]):
            if is_exact:
                k = j + stop - start
                out.append(ad.layer(layer, x[:, j:k], rope.rows(slice(j, k)), index[j:k], self.state, None,
                                    host=exact[j:k]))
                j = k
            else:
                ad.advance_state(layer, self._predicted(i, _on(self.device, np.arange(start, stop))), self.state)
        return torch.cat(out, dim=1)

    def up_front_scores(self, planner: Planner, maps: RidgeMaps | None, exact: np.ndarray,
                        induction: Tensor | None) -> dict[int, Tensor]:
        """Device scores of the up-front parts scored on the device: a query-agnostic part's leverage of
        ``h_S``; a one-pass part's attention of the last exact rows' predicted queries over every row's
        predicted keys in the kept heads (every row's predicted K/V are written first; exact rows overwrite
        theirs when they run)."""
        out: dict[int, Tensor] = {}
        parts = planner.parts
        predicted = {i: AttentionScores(self.adapter, self.h.shape[1], parts[i], induction)
                     for i in planner.device_parts() if parts[i].by == "predicted"}
        for i in planner.device_parts():
            if parts[i].by == "leverage":
                out[i] = leverage_scores(self.h, maps.mean_h, maps.cov_h)
        if not predicted:
            return out
        self.fill(np.arange(self.h.shape[1]), exact)
        rows = exact[-max(s.rows for s in predicted.values()):]
        index = _on(self.device, rows)
        rope = self.rope.rows(index)
        for i, layer in enumerate(self.late):
            scoring = [s for s in predicted.values() if s.heads[layer]]
            if not scoring or not self.attention[i]:
                continue
            x_hat = self._predicted(i, index)
            for s in scoring:
                q = min(s.rows, rows.size)
                s.add(layer, x_hat[:, -q:], rope.rows(slice(-q, None)), index[-q:], self.keys[i], None, host=rows[-q:])
        out.update({i: s.scores for i, s in predicted.items()})
        return out

    def select_passes(self, planner: Planner, exact: np.ndarray, induction: Tensor | None) -> tuple[Tensor, np.ndarray]:
        """The late layers with row selection's attention rounds (none: one pass): a pass of the exact rows
        that records the attention parts' scores, which are read once, then the parts choose and a pass runs
        the rows that changed. A scoring pass stops after the last layer with a kept head; when no row
        changes, the pass goes on from there. Returns the last layer's output of the exact rows and the
        final exact set."""
        x, done, ran = None, len(self.late), None
        for r in range(planner.rounds + 1):
            if ran is None or not np.array_equal(ran, exact):
                scorers = planner.scorers(self.adapter, r, induction)
                done = len(self.late)
                if scorers:  # the scores need the layers up to the last kept head only
                    done = 1 + max(layer for s in scorers.values() for layer in s.layers()) - self.late.start
                    done = min(max(done, 0), len(self.late))
                x, ran = self.run(exact, list(scorers.values()), stop=done), exact
            if r < planner.rounds:
                exact = planner.after_pass(r, read_scores({i: s.scores for i, s in scorers.items()}), exact)
        if done < len(self.late):  # no row changed after the last scoring pass: finish it
            x = self.run(exact, start=done, x=x)
        return x, exact

    def cache_rows(self, exact: np.ndarray) -> tuple[list, list]:
        """Per late layer ``[batch, kv_heads, rows, head_dim]`` K/V for the returned cache: every row
        (mode ``"none"``: the exact rows only); a recurrent layer's state stands for its cache."""
        if self.none:
            index = _on(self.device, exact)
            keys = [None if k is None else _rows(k, exact, index, 2) for k in self.keys]
            values = [None if v is None else _rows(v, exact, index, 2) for v in self.values]
        else:
            keys, values = list(self.keys), list(self.values)
        for i, att in enumerate(self.attention):
            if not att:
                keys[i], values[i] = self.state, None
        return keys, values


def _prefill_exact(model: torch.nn.Module, input_ids: Tensor, ex: Tensor, logits: str) -> PrefillResult:
    """Mode ``"exact"``: the plain ``transformers`` forward; LM head on the requested rows only (``ex``: the
    exact positions, a device index)."""
    cache = DynamicCache(config=model.config)
    record_sliding_windows(cache)  # sliding-window layers keep a whole window, so generate_after can crop(-1)
    out = model.get_decoder()(input_ids=input_ids, cache=cache, use_cache=True)
    trim_sliding_windows(out.cache)
    hidden = out.last_hidden_state
    hidden = hidden[:, -1:] if logits == "last" else hidden[:, ex]
    result = model.get_output_embeddings()(hidden)
    _check_finite([bool(torch.isfinite(result).all())], ["the logits of the exact forward"])
    return PrefillResult(out.cache, result, ex.cpu(), None, "exact")


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
