"""Splice tests (paper, "Evaluation"): which part of the filled cache carries the fill's error.

The fill runs as usual, but in the late layers the filled rows' predicted keys, values, or only the
keys' scale are replaced by the exact ones (from an exact prefill of the same prompt) *before* any
exact row attends to them, through :func:`ridgefill.fill.prefill_instrumented`'s ``kv_hook``. The exact rows'
own late-layer K/V then follow from the spliced cache, so the ΔNLL that is left says how much of the
error the replaced component carried:

- ``fill``: no splice (the fill's own ΔNLL);
- ``k``: exact keys; ``v``: exact values; ``kv``: both (reproduces the exact NLL to rounding: the
  exact rows then see exactly the exact cache);
- ``k_scale``: each filled key vector (per row, per KV head) rescaled to the exact key's L2 norm,
  direction kept from the fill (RoPE is a rotation, so the norm is the same before and after it);
- ``k_direction``: the exact key's direction at the fill's norm (the complement of ``k_scale``).

A splice may be restricted to a subset of late layers (``layers``).

Hybrid models (recurrent-state layers, :mod:`ridgefill.adapters.hybrid`) keep a conv state and a
delta-rule state instead of K/V in their linear-attention layers; there the filled rows' error lives
in the state the exact rows start from:

- ``state``: in every late recurrent layer the filled rows leave the *exact* state (from the
  ``transformers`` forward of the filled rows, :func:`exact_states`; loaded through
  :meth:`~ridgefill.adapters.HybridAdapter.spliced_states`); late attention layers keep the fill's K/V;
- :func:`state_errors`: the relative error of the filled state against the exact one, per late
  recurrent layer, after the filled rows and at the end of the prompt (the state handed to decoding).

The K/V components need ``prefill``'s ``kv_hook``, which models with recurrent-state layers refuse for
now: on those models the components are ``fill`` and ``state`` (:func:`components_for`).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch
from torch import Tensor

from ..errors import InputError
from ..fill import KVHook

#: Splice components of the K/V cache, in report order.
COMPONENTS: tuple[str, ...] = ("fill", "k", "v", "kv", "k_scale", "k_direction")
#: Splice components of the recurrent state (hybrid models).
STATE_COMPONENTS: tuple[str, ...] = ("state",)
#: Every component the splice tests know.
ALL_COMPONENTS: tuple[str, ...] = COMPONENTS + STATE_COMPONENTS


def components_for(model: torch.nn.Module) -> tuple[str, ...]:
    """The splice components that apply to ``model``: :data:`COMPONENTS` for attention-only models,
    ``("fill", "state")`` for models with recurrent-state layers (whose fill refuses ``kv_hook``)."""
    from ..adapters import adapter_for

    return ("fill",) + STATE_COMPONENTS if adapter_for(model).recurrent_layers else COMPONENTS


def check_components(model: torch.nn.Module, components: Sequence[str]) -> None:
    """Raises InputError: an unknown component, or one that does not apply to ``model``."""
    for c in components:
        if c not in ALL_COMPONENTS:
            raise InputError(f"splice component must be one of {ALL_COMPONENTS}; got {c!r}")
    fit = components_for(model)
    wrong = [c for c in components if c not in fit]
    if wrong:
        why = ("it has recurrent-state layers, whose fill takes no kv_hook (K/V splices)" if "state" in fit
               else "it has no recurrent-state layers")
        raise InputError(f"splice components {wrong} do not apply to this model ({why}); use {','.join(fit)}")


@torch.inference_mode()
def _prefix_forward(model: torch.nn.Module, ids: Tensor, rows: int):
    """The ``transformers`` forward of the first ``rows`` rows of ``ids``: ``(cache, hidden_states)``."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model.get_decoder()(input_ids=ids[:, :rows], cache=cache, use_cache=True, output_hidden_states=True)
    return out.cache, out.hidden_states


def exact_states(model: torch.nn.Module, ids: Tensor, rows: int, layers: Iterable[int]) -> dict[int, tuple[Tensor, Tensor]]:
    """``{l: (conv [batch, conv_dim, kernel], delta-rule [batch, value_heads, key_dim, value_dim])}``:
    the exact states of recurrent ``layers`` after the first ``rows`` rows of ``ids`` ``[batch, N]``
    int64, from the ``transformers`` forward of those rows (the states the exact rows of a fill with
    ``rows`` filled rows would start from if the fill were exact).

    Raises:
        InputError: ``rows`` not in ``1..N``, or a layer without a recurrent state.
    """
    from ..adapters import adapter_for

    layers = list(layers)
    ad = adapter_for(model)
    if not 1 <= rows <= ids.shape[1]:
        raise InputError(f"exact_states needs 1..{ids.shape[1]} rows; got {rows}")
    if any(not ad.is_recurrent(l) for l in layers):
        raise InputError(f"layers {[l for l in layers if not ad.is_recurrent(l)]} have no recurrent state; "
                         f"recurrent: {list(ad.recurrent_layers)}")
    cache, _ = _prefix_forward(model, ids, rows)
    return {l: (cache.layers[l].conv_states[0], cache.layers[l].recurrent_states[0]) for l in layers}


def _rel(a: Tensor, b: Tensor) -> float:
    """``‖a − b‖ / ‖b‖`` (Frobenius, float64)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


@torch.inference_mode()
def state_errors(model: torch.nn.Module, ids: Tensor, *, tail: int, mode: str, maps=None, split: int | None = None,
                 exact=None) -> dict[int, dict[str, float]]:
    """Exact state vs filled state in each late recurrent layer of a hybrid model.

    Args:
        ids: ``[batch, N]`` int64 prompt; ``tail``, ``mode`` (``"ridge"`` with ``maps`` or
            ``"identity"`` with ``split``): the fill, as for :func:`ridgefill.fill.prefill`.
        exact: the exact :class:`~ridgefill.fill.PrefillResult` of ``ids`` (computed when ``None``).

    Returns:
        ``{l: {"conv_after_filled", "recurrent_after_filled", "conv_prompt_end",
        "recurrent_prompt_end"}}``: relative Frobenius errors ``‖S_fill − S_exact‖ / ‖S_exact‖`` of the
        conv and delta-rule states after the filled rows (the fill's state from the predicted inputs,
        :meth:`~ridgefill.adapters.HybridAdapter.advance_state`, against the ``transformers`` forward
        of the filled rows) and after the whole prompt (the states in the two prefills' caches); the
        ``after_filled`` entries are absent when there are no filled rows. ``{}`` when no late layer
        is recurrent.

    Raises:
        InputError: a mode other than ``ridge``/``identity``, ridge without maps, identity without split.
    """
    from ..adapters import adapter_for
    from ..fill import context_features, predict_inputs, prefill

    if mode not in ("ridge", "identity") or (mode == "ridge" and maps is None) or (mode == "identity" and split is None):
        raise InputError("state_errors needs mode 'ridge' with maps or 'identity' with a split")
    split = maps.split if mode == "ridge" else split
    ad = adapter_for(model)
    late = [l for l in ad.recurrent_layers if l > split]
    if not late:
        return {}
    n = ids.shape[1]
    res = prefill(model, ids, maps if mode == "ridge" else None, tail=tail, mode=mode, split=split, select=None)
    if exact is None:
        exact = prefill(model, ids, tail=n, mode="exact")
    out = {}
    for l in late:
        a, b = res.cache.layers[l], exact.cache.layers[l]
        out[l] = {"conv_prompt_end": _rel(a.conv_states[0], b.conv_states[0]),
                  "recurrent_prompt_end": _rel(a.recurrent_states[0], b.recurrent_states[0])}
    if n - tail:
        cache, hidden = _prefix_forward(model, ids, n - tail)
        h = hidden[split + 1]  # h_S of the filled rows
        m = maps.to(dtype=h.dtype, device=h.device) if mode == "ridge" else None
        for l in late:
            state = ad.new_state()
            ad.advance_state(l, h if m is None else predict_inputs(context_features(h, m.context), *m.layer(l)), state)
            out[l]["conv_after_filled"] = _rel(state.layers[l].conv_states[0], cache.layers[l].conv_states[0])
            out[l]["recurrent_after_filled"] = _rel(state.layers[l].recurrent_states[0],
                                                    cache.layers[l].recurrent_states[0])
    return out


def exact_kv(cache, layers: Iterable[int]) -> dict[int, tuple[Tensor, Tensor]]:
    """``{l: (K, V)}`` from an exact prefill's cache, each ``[batch, kv_heads, N, head_dim]``.

    Raises:
        InputError: a layer's cache holds fewer positions than the longest layer's (a sliding-window
            cache that dropped old rows), so the filled rows' exact K/V are not all there.
    """
    out = {l: (cache.layers[l].keys, cache.layers[l].values) for l in layers}
    n = max((k.shape[2] for k, _ in out.values()), default=0)
    short = [l for l, (k, _) in out.items() if k.shape[2] < n]
    if short:
        raise InputError(f"the exact cache of layers {short} holds fewer than the {n} prompt positions (a "
                         "sliding-window cache keeps only recent rows); splice tests need every row's exact K/V")
    return out


def splice_hook(exact: Mapping[int, tuple[Tensor, Tensor]], component: str,
                layers: Iterable[int] | None = None, eps: float = 1e-12) -> KVHook | None:
    """A ``kv_hook`` for :func:`ridgefill.fill.prefill_instrumented` that splices ``component`` of the exact cache.

    Args:
        exact: ``{l: (K, V)}`` exact keys (after RoPE) and values ``[batch, kv_heads, N, head_dim]``
            for every late layer to splice (see :func:`exact_kv`).
        component: one of :data:`COMPONENTS` (``"fill"`` returns ``None``: no hook).
        layers: late layers to splice (default: every layer in ``exact``).

    Returns:
        ``hook(layer, k, v, filled) -> (k, v)`` acting on the filled rows ``filled`` ``[rows]``.

    Raises:
        InputError: an unknown component, or a layer to splice that ``exact`` does not hold.
    """
    if component not in COMPONENTS:
        raise InputError(f"splice component must be one of {COMPONENTS}; got {component!r}")
    if component == "fill":
        return None
    chosen = set(exact) if layers is None else set(layers)
    if not chosen <= set(exact):
        raise InputError(f"splice layers {sorted(chosen - set(exact))} have no exact K/V; give the exact "
                         "cache of every late layer to splice")

    def hook(layer: int, k: Tensor, v: Tensor, filled: Tensor) -> tuple[Tensor, Tensor]:
        if layer not in chosen:
            return k, v
        ek, ev = exact[layer]
        ek, ev = ek.index_select(2, filled.to(ek.device)), ev.index_select(2, filled.to(ev.device))
        if component == "k":
            return ek, v
        if component == "v":
            return k, ev
        if component == "kv":
            return ek, ev
        nk, ne = k.norm(dim=-1, keepdim=True), ek.norm(dim=-1, keepdim=True)
        if component == "k_scale":
            return k * (ne / nk.clamp_min(eps)), v
        return ek * (nk / ne.clamp_min(eps)), v  # k_direction

    return hook


def splice_variants(model: torch.nn.Module, maps_by_split: Mapping[int, object], *, tail: int, mode: str = "ridge",
                    components: Sequence[str] | None = None, layers: Iterable[int] | None = None) -> dict:
    """``{"<S>/<mode>+<component>": fn(doc, exact) -> nll [T]}`` for
    :func:`ridgefill.evaluate.loss.score_documents`, which passes each document's exact
    :class:`ridgefill.fill.PrefillResult` (whose cache supplies the exact K/V); each ``fn`` runs one
    spliced fill prefill. ``components``: default :func:`components_for` the model; ``state`` splices
    the exact recurrent state after the filled rows (:func:`exact_states`) into the late recurrent
    layers (or those in ``layers``).

    Raises:
        InputError: a mode other than ``ridge``/``identity``, ridge without maps, or a component that
            is unknown or does not apply to the model.
    """
    from ..adapters import adapter_for
    from .loss import tail_nll

    if mode not in ("ridge", "identity"):
        raise InputError(f"splice needs a fill that predicts K/V: mode 'ridge' or 'identity', not {mode!r}")
    components = components_for(model) if components is None else tuple(components)
    check_components(model, components)
    ad = adapter_for(model)
    L = model.config.num_hidden_layers
    chosen = None if layers is None else set(layers)
    out = {}
    for split, maps in maps_by_split.items():
        if mode == "ridge" and maps is None:
            raise InputError(f"splice in mode 'ridge' at split {split} needs maps")
        late = [l for l in range(split + 1, L) if not ad.is_recurrent(l)]  # layers with K/V
        for comp in components:
            if comp == "state":
                rec = [l for l in ad.recurrent_layers if l > split and (chosen is None or l in chosen)]

                def fn(doc, exact, s=split, mp=maps, rec=rec):
                    ids = doc[None, :-1].to(next(model.parameters()).device)
                    rows = ids.shape[1] - tail
                    states = exact_states(model, ids, rows, rec) if rows > 0 and rec else {}
                    with ad.spliced_states(states):
                        return tail_nll(model, doc, tail=tail, mode=mode, maps=mp if mode == "ridge" else None,
                                        split=s)[0]
            else:
                def fn(doc, exact, s=split, mp=maps, c=comp, late=late):
                    hook = None if c == "fill" else splice_hook(exact_kv(exact.cache, late), c, layers)
                    return tail_nll(model, doc, tail=tail, mode=mode, maps=mp if mode == "ridge" else None,
                                    split=s, kv_hook=hook)[0]
            out[f"{split}/{mode}+{comp}"] = fn
    return out


# --------------------------------------------------------------------------------------------------
# Fixes suggested by the splices (deployable: they use calibration text only, never the exact cache)
# --------------------------------------------------------------------------------------------------

@torch.inference_mode()
def fit_key_scales(model: torch.nn.Module, maps, chunks: Sequence[Tensor], *, mode: str = "ridge",
                   split: int | None = None) -> Tensor:
    """A key-scale correction: per late layer and KV head, the scalar ``α`` that best maps the fill's
    key norms to the exact ones on calibration text, ``α = Σ ‖k_exact‖‖k_fill‖ / Σ ‖k_fill‖²`` (least
    squares over every row of every chunk).

    Args:
        maps: the fill's maps (mode ``"ridge"``) or ``None`` (mode ``"identity"``, needs ``split``).
        chunks: ``[chunk]`` int64 token ids each, from calibration text (one exact forward per chunk).

    Returns:
        ``[L − S − 1, kv_heads]`` float64 scales for layers ``S+1..L-1``.

    Raises:
        InputError: no chunks, a bad mode, or no split.
    """
    from ..adapters import adapter_for
    from ..fill import context_features, predict_inputs

    if not chunks:
        raise InputError("fit_key_scales needs at least one calibration chunk")
    if mode not in ("ridge", "identity") or (mode == "ridge" and maps is None):
        raise InputError("fit_key_scales: mode must be 'ridge' (with maps) or 'identity'")
    split = maps.split if maps is not None else split
    if split is None:
        raise InputError("fit_key_scales: give the split for the identity fill")
    adapter = adapter_for(model)
    L = adapter.num_layers
    device = next(model.parameters()).device
    num = torch.zeros(L - split - 1, adapter.num_kv_heads, dtype=torch.float64)
    den = torch.zeros_like(num)
    for ids in chunks:
        ids = ids.to(device)[None]
        positions = torch.arange(ids.shape[1], device=device)
        x = adapter.embed(ids)
        rope = adapter.rope(positions, x)
        m = maps.to(dtype=x.dtype, device=device) if maps is not None else None
        h_split = None
        for layer in range(L):
            if layer > split:
                x_hat = predict_inputs(context_features(h_split, m.context), *m.layer(layer)) if mode == "ridge" else h_split
                ke, _ = adapter.kv(layer, x, rope)
                kf, _ = adapter.kv(layer, x_hat, rope)
                ne, nf = ke.norm(dim=-1).double(), kf.norm(dim=-1).double()  # [1, kv_heads, rows]
                num[layer - split - 1] += (ne * nf).sum((0, 2)).cpu()
                den[layer - split - 1] += (nf * nf).sum((0, 2)).cpu()
            if layer == L - 1:
                break
            shape = (1, adapter.num_kv_heads, ids.shape[1], adapter.head_dim)
            x = adapter.layer(layer, x, rope, positions, x.new_empty(shape), x.new_empty(shape))
            if layer == split:
                h_split = x
    return num / den.clamp_min(1e-30)


def key_scale_hook(scales: Tensor, split: int) -> KVHook:
    """A ``kv_hook`` multiplying the filled keys of late layer ``l`` and KV head ``h`` by
    ``scales[l − S − 1, h]`` (:func:`fit_key_scales`); values untouched."""
    scales = scales.detach()

    def hook(layer: int, k: Tensor, v: Tensor, filled: Tensor) -> tuple[Tensor, Tensor]:
        s = scales[layer - split - 1].to(dtype=k.dtype, device=k.device)
        return k * s[None, :, None, None], v

    return hook


def refit_lambda(maps, factor: float):
    """The same maps re-solved with every layer's ``λ`` multiplied by ``factor`` (from the statistics
    saved with the maps: more shrinkage towards the identity fill for ``factor > 1``).

    Raises:
        InputError: the maps carry no statistics, or ``factor`` is not positive.
    """
    from ..maps import RidgeMaps
    from ..ridge import fit_maps

    if maps.stats is None:
        raise InputError("these maps carry no calibration statistics (<name>.stats.safetensors); refit them "
                         "with `ridgefill calibrate` to re-solve with another λ")
    if not factor > 0:
        raise InputError(f"λ factor must be > 0; got {factor}")
    res = fit_maps(maps.stats, [v * factor for v in maps.lambdas], context_penalty=maps.context_penalty)
    meta = dict(maps.meta, lambda_spec=f"{maps.meta.get('lambda_spec')}x{factor:g}")
    return RidgeMaps(maps.split, res.weights.float(), res.biases.float(), res.lambdas, meta)


def fix_variants(model: torch.nn.Module, maps_by_split: Mapping[int, object], *, tail: int,
                 key_scales: Mapping[int, Tensor] | None = None, lam_factors: Sequence[float] = ()) -> dict:
    """``{"<S>/ridge+kscale": fn, "<S>/ridge@lam×c": fn}`` variants for
    :func:`ridgefill.evaluate.loss.score_documents`: ridge with a fitted key-scale correction
    (:func:`fit_key_scales`), and ridge re-solved with ``λ × c`` (:func:`refit_lambda`)."""
    from .loss import tail_nll

    out = {}
    for split, maps in maps_by_split.items():
        if key_scales and split in key_scales:
            hook = key_scale_hook(key_scales[split], split)
            out[f"{split}/ridge+kscale"] = (lambda doc, _e, s=split, mp=maps, h=hook:
                                            tail_nll(model, doc, tail=tail, mode="ridge", maps=mp, split=s, kv_hook=h)[0])
        for c in lam_factors:
            refit = refit_lambda(maps, c)
            out[f"{split}/ridge@lam×{c:g}"] = (lambda doc, _e, s=split, mp=refit:
                                               tail_nll(model, doc, tail=tail, mode="ridge", maps=mp, split=s)[0])
    return out
