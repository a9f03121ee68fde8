"""The fill prefill (paper, "Approach"): exact lower layers, predicted late-layer cache rows.

Data path for a prompt of ``N`` rows, split ``S``, ``L`` layers:

1. Layers ``0..S`` run exactly on every row (causal attention, as in the plain forward).
2. ``h_S`` (the output of layer ``S``) is the split state. For each late layer ``l > S`` every
   *filled* row predicts its layer input ``x̂_l = h_S W_l + b_l`` (:func:`predict_inputs`) and writes
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
from .adapters.base import record_sliding_windows, trim_sliding_windows
from .errors import InputError, NonFiniteError
from .maps import RidgeMaps
from .validate import binds_prompt, check_choice, check_int, check_rows, prompt_digest

Mode = Literal["ridge", "identity", "none", "exact"]
#: ``kv_hook(layer, keys, values, filled_positions) -> (keys, values)``: see :func:`prefill`.
KVHook = Callable[[int, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
MODES: tuple[str, ...] = ("exact", "ridge", "identity", "none")


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
        prompt_rows: ``N``, the length of the prompt prefilled (set by :func:`prefill`).
        prompt_sha256: :func:`ridgefill.validate.prompt_digest` of its ``input_ids`` (set by :func:`prefill`);
            :func:`generate_after` refuses other ids.
        consumed: set by :func:`generate_after`, which extends ``cache`` in place: a result decodes once.
    """

    cache: object
    logits: Tensor
    exact_positions: Tensor
    split: int | None
    mode: str
    prompt_rows: int | None = None
    prompt_sha256: str | None = None
    consumed: bool = False


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
        h_split: ``[batch, rows, d]`` split state of the filled rows.
        weight: ``W_l`` ``[d, d]``; bias: ``b_l`` ``[d]`` (same dtype as ``h_split``).

    Returns:
        ``[batch, rows, d]``. With ``W = I`` and ``b = 0`` it is ``h_S`` itself, the identity fill
        (Lean: ``KvaLean.Identity.identity_fill_eq``).
    """
    return torch.addmm(bias, h_split.reshape(-1, h_split.shape[-1]), weight).view(h_split.shape)


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
            fast: bool = True) -> PrefillResult:
    """Prefill ``input_ids`` with RidgeFill (or a baseline) and return the cache and logits.

    Args:
        model: a causal LM with an adapter (see :mod:`ridgefill.adapters`), in eval mode.
        input_ids: ``[batch, N]`` int64 token ids (no padding; the batch shares its exact rows).
        maps: fitted maps (mode ``"ridge"``); checked against ``model`` and ``split``.
        tail: number of final rows that run the full model (``1 ≤ tail ≤ N``).
        exact_rows: further absolute positions that run the full model.
        mode: ``"ridge"``, ``"identity"``, ``"none"`` or ``"exact"`` (see module docstring).
        split: ``S`` (``0 ≤ S ≤ L-2``); defaults to ``maps.split``; required for identity/none without maps.
        logits: ``"last"`` for the last row only, ``"exact"`` for every exact row.
        kv_hook: evaluation extension point (splice tests, :mod:`ridgefill.evaluate.splice`): in modes
            ``"ridge"``/``"identity"``, for each late layer ``l``, called as ``kv_hook(l, k, v, filled)``
            with the filled rows' predicted keys (after RoPE) and values ``[batch, kv_heads, rows,
            head_dim]`` and their positions ``filled`` ``[rows]``, before any exact row attends to them
            (in sliding-window layers only the rows some exact row sees, see
            :meth:`~ridgefill.adapters.DecoderAdapter.needed_filled_rows`);
            it returns the ``(k, v)`` to write instead (same shapes). ``None``: no hook.
        fast: in modes ``"ridge"``/``"identity"``, compute the filled rows' K/V of all late layers in
            one batched step (:meth:`~ridgefill.adapters.LlamaAdapter.fill_kv`) when the adapter has
            it, there is no ``kv_hook`` and every late layer reads every filled row; the values equal
            the per-layer path's (``fast=False``, the reference) up to float rounding.

    Returns:
        :class:`PrefillResult`.

    Raises:
        InputError: a bad type, shape or value of ``input_ids``, ``mode``, ``tail`` (an integer, not a
            float or bool), ``exact_rows``, ``split``, ``logits`` (only ``"last"`` or ``"exact"``) or ``maps``.
        MapsMismatchError: ``maps`` belong to another model or split.
        NonFiniteError: NaN/Inf activations.
    """
    check_choice(mode, "mode", MODES)
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.shape[1] < 1 \
            or input_ids.dtype != torch.long:
        got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise InputError(f"input_ids must be an int64 tensor [batch, rows]; got {got}")
    n = input_ids.shape[1]
    check_int(tail, "tail", lo=1, hi=n, hint="the last row must be exact and the tail cannot be longer than "
              "the prompt (use mode='exact' to run every row exactly)")
    exact_rows = check_rows(exact_rows, "exact_rows", n)
    check_choice(logits, "logits", ("last", "exact"))
    if split is not None:
        check_int(split, "split", lo=0)
    if maps is not None and not isinstance(maps, RidgeMaps):
        raise InputError(f"maps must be a RidgeMaps (ridgefill.load_maps) or None; got {type(maps).__name__}")
    if kv_hook is not None and not callable(kv_hook):
        raise InputError(f"kv_hook must be callable or None; got {type(kv_hook).__name__}")
    ex = exact_positions(n, tail, exact_rows).to(input_ids.device)
    if mode == "exact":
        return _prefill_exact(model, input_ids, ex, logits)

    adapter = adapter_for(model)
    L = adapter.num_layers
    if mode == "ridge":
        if maps is None:
            raise InputError("mode='ridge' needs maps: fit them with `ridgefill calibrate` and load them "
                             "with ridgefill.load_maps")
        maps.check_model(model, split)
        split = maps.split
    elif split is None:
        split = maps.split if maps is not None else None
    if split is None or not 0 <= split <= L - 2:
        raise InputError(f"split S={split} is out of range: this model has {L} layers, so 0 ≤ S ≤ {L - 2} "
                         "(at least one late layer)")

    device = input_ids.device
    positions = torch.arange(n, device=device)
    filled = torch.ones(n, dtype=torch.bool, device=device)
    filled[ex] = False
    fl = positions[filled]

    x = adapter.embed(input_ids)
    rope = adapter.rope(positions, x)
    keys, values = [], []

    def buffers(like_k_rows: int = n) -> tuple[Tensor, Tensor]:
        shape = (x.shape[0], adapter.num_kv_heads, like_k_rows, adapter.head_dim)
        return x.new_empty(shape), x.new_empty(shape)

    for layer in range(split + 1):  # lower layers: every row, exactly
        k, v = buffers()
        x = adapter.layer(layer, x, rope, positions, k, v)
        keys.append(k)
        values.append(v)
    _check_finite(x, f"the split state h_S (output of layer {split})")

    h_fill = _rows(x, fl, 1)
    rope_fill, rope_ex = rope.rows(fl), rope.rows(ex)
    x = _rows(x, ex, 1)
    if maps is not None and mode == "ridge":
        maps = maps.to(dtype=x.dtype, device=device)
    visible = None if mode != "none" else ~filled
    late = range(split + 1, L)
    batched_kv = None  # fast path: the filled rows' K/V of every late layer in one step, before the loop
    if (fast and mode != "none" and kv_hook is None and fl.numel() and hasattr(adapter, "fill_kv")
            and adapter.supports_fill_kv() and all(adapter.needed_filled_rows(i, fl, ex) is None for i in late)):
        shape = (len(late), x.shape[0], adapter.num_kv_heads, n, adapter.head_dim)
        batched_kv = x.new_empty(shape), x.new_empty(shape)
        first, count = int(fl[0]), fl.numel()
        contiguous = int(fl[-1]) - first + 1 == count
        outs = ((batched_kv[0].narrow(3, first, count), batched_kv[1].narrow(3, first, count)) if contiguous
                else (x.new_empty(shape[:3] + (count, shape[4])), x.new_empty(shape[:3] + (count, shape[4]))))
        w, b = (maps.weights, maps.biases) if mode == "ridge" else (None, None)
        adapter.fill_kv(late, h_fill, w, b, rope_fill, *outs)
        if not contiguous:
            batched_kv[0].index_copy_(3, fl, outs[0])
            batched_kv[1].index_copy_(3, fl, outs[1])
        del outs
    for layer in late:  # late layers
        k, v = buffers() if batched_kv is None else (batched_kv[0][layer - late[0]], batched_kv[1][layer - late[0]])
        if batched_kv is not None:
            pass  # the filled rows' K/V were written by adapter.fill_kv above
        elif mode == "none":
            k[:, :, fl] = 0
            v[:, :, fl] = 0
        elif fl.numel():
            # only the filled rows this layer can ever read (all, except in sliding-window layers)
            need = adapter.needed_filled_rows(layer, fl, ex)
            if need is None:
                fl_l, h_l, rope_l = fl, h_fill, rope_fill
            else:
                fl_l, h_l, rope_l = fl[need], _rows(h_fill, need, 1), rope_fill.rows(need)
                if fl_l.numel() < fl.numel():
                    k.zero_()  # rows left out hold zeros (never read; no uninitialised memory)
                    v.zero_()
            if fl_l.numel():
                x_hat = predict_inputs(h_l, *maps.layer(layer)) if mode == "ridge" else h_l
                kf, vf = adapter.kv(layer, x_hat, rope_l)
                if kv_hook is not None:
                    kf, vf = kv_hook(layer, kf, vf, fl_l)
                first, last = int(fl_l[0]), int(fl_l[-1])
                if fl_l.numel() == last - first + 1:  # contiguous filled rows: write with a slice
                    k[:, :, first:last + 1] = kf
                    v[:, :, first:last + 1] = vf
                else:
                    k[:, :, fl_l] = kf
                    v[:, :, fl_l] = vf
        x = adapter.layer(layer, x, rope_ex, ex, k, v, visible=visible)
        if mode == "none":
            k, v = _rows(k, ex, 2), _rows(v, ex, 2)
        keys.append(k)
        values.append(v)

    out = adapter.logits(x[:, -1:] if logits == "last" else x)
    _check_finite(out, "the logits of the exact rows")
    cache = adapter.build_cache(keys, values)
    return PrefillResult(cache, out, ex, split, mode)


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
    check_int(max_new_tokens, "max_new_tokens", lo=1)
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
    cache.crop(-1)
    out = model.generate(input_ids, cache=cache, max_new_tokens=max_new_tokens, do_sample=False,
                         min_new_tokens=max_new_tokens, pad_token_id=model.config.eos_token_id)
    return out[:, input_ids.shape[1]:]
