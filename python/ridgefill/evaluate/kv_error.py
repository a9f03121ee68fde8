"""Held-out error of the filled rows' keys and values, per late layer (issue: maps fitted to K/V).

For each held-out document the model runs every layer exactly; for each late layer ``l`` the true
pre-RoPE keys and values (:meth:`~ridgefill.adapters.LlamaAdapter.kv_targets`) are compared with
what a fill writes for the same rows:

- input maps (kind ``"inputs"``, and the identity / centred fills): ``kv_targets(l, x̂_l)`` with
  ``x̂_l = h_S W_l + b_l``, through the layer's own norm and K/V projections;
- K/V maps (kind ``"kv"``): ``h_S W_l + b_l`` directly.

Reported per layer and for keys and values separately: the relative squared error
``Σ‖t̂ − t‖² / Σ‖t − t̄‖²`` and, for keys, the mean cosine between predicted and true key vectors
per head (the key *direction*, which the splice tests found carries the fill's retrieval error).
RoPE is a rotation applied equally to both, so pre-RoPE errors equal post-RoPE errors.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import Tensor

from ..adapters import adapter_for
from ..fill import context_features
from ..maps import RidgeMaps


@torch.inference_mode()
def kv_errors(model: torch.nn.Module, docs: Sequence[Tensor], fills: Mapping[str, RidgeMaps | str],
              split: int) -> dict[str, list[dict]]:
    """Per fill and late layer: key/value relative squared error and key cosine on ``docs``.

    Args:
        docs: ``[rows]`` int64 token ids each (held-out text).
        fills: name -> maps (either kind), or ``"identity"``.
        split: ``S`` (every maps object must have this split).

    Returns:
        ``{name: [{"layer", "key_rel", "value_rel", "key_cos"}, ...]}`` for layers ``S+1..L-1``.
    """
    ad = adapter_for(model)
    L = ad.num_layers
    kvd = ad.num_kv_heads * ad.head_dim
    acc = {name: [[0.0, 0.0, 0.0, 0] for _ in range(split + 1, L)] for name in fills}  # k err, v err, cos sum, rows
    tot = [[0.0, 0.0] for _ in range(split + 1, L)]
    sums = [[None, None, 0] for _ in range(split + 1, L)]
    for doc in docs:
        ids = doc[None]
        n = ids.shape[1]
        pos = torch.arange(n)
        x = ad.embed(ids)
        rope = ad.rope(pos, x)
        h = None
        for layer in range(L):
            if layer == split + 1:
                h = x
            if layer > split:
                i = layer - split - 1
                t = ad.kv_targets(layer, x)[0].double()
                tk, tv = t[:, :kvd], t[:, kvd:]
                for name, fill in fills.items():
                    if isinstance(fill, str):
                        p = ad.kv_targets(layer, h)[0].double()
                    else:
                        w, b = fill.layer(layer)
                        pred = context_features(h[0], fill.context) @ w.to(h.dtype) + b.to(h.dtype)
                        p = (ad.kv_targets(layer, pred[None])[0] if fill.kind == "inputs" else pred).double()
                    pk, pv = p[:, :kvd], p[:, kvd:]
                    a = acc[name][i]
                    a[0] += float((pk - tk).square().sum())
                    a[1] += float((pv - tv).square().sum())
                    cos = torch.nn.functional.cosine_similarity(pk.view(n, ad.num_kv_heads, -1),
                                                                tk.view(n, ad.num_kv_heads, -1), dim=-1)
                    a[2] += float(cos.sum())
                    a[3] += n * ad.num_kv_heads
                s = sums[i]
                s[0] = tk.sum(0) if s[0] is None else s[0] + tk.sum(0)
                s[1] = tv.sum(0) if s[1] is None else s[1] + tv.sum(0)
                s[2] += n
                tot[i][0] += float(tk.square().sum())
                tot[i][1] += float(tv.square().sum())
            if layer < L - 1:
                shape = (1, ad.num_kv_heads, n, ad.head_dim)
                x = ad.layer(layer, x, rope, pos, x.new_empty(shape), x.new_empty(shape))
    out = {}
    for name in fills:
        rows = []
        for i, layer in enumerate(range(split + 1, L)):
            sk, sv, m = sums[i]
            var_k = tot[i][0] - float(sk.square().sum()) / m  # Σ‖t − t̄‖²
            var_v = tot[i][1] - float(sv.square().sum()) / m
            a = acc[name][i]
            rows.append({"layer": layer, "key_rel": a[0] / var_k, "value_rel": a[1] / var_v, "key_cos": a[2] / a[3]})
        out[name] = rows
    return out
