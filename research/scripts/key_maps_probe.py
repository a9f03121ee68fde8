#!/usr/bin/env python3
"""``ridgefill eval needle`` / ``eval loss`` with the filled rows' keys predicted by other maps (a probe).

The fill writes a filled row's keys and values from one prediction ``x̂_l`` (the ``--maps`` file). This
script runs an ``eval`` command with one change: in every fill with context maps (mode ``ridge``), each
filled row's *keys* are computed from a second maps file's prediction (``--key-maps``, maps without
context: ``x̂_l = h_S(t) W_l + b_l``) through the layer's own norm, K projection and RoPE; its values stay
those of the context maps. It goes through the public ``kv_hook`` of :func:`ridgefill.fill.prefill` (so the
batched fill is off and the split state is computed once more per prompt: slower, same values), and it
asks which half of the context maps' prediction carries their needle loss and their key-token gain
(docs/evaluate.md, "Eighteenth session"). Fills with maps without context, and the exact prefill, are
left as they are (the script says so when no fill was changed). With ``--select`` the attention parts score
the probe's keys, so the chosen rows can differ from those of the context maps' own fill.

Usage::

    python scripts/key_maps_probe.py --key-maps maps-S15-plain.safetensors eval needle --maps \\
        maps-S15-ctx.safetensors --threads 1 --lengths 8000 --trials 16 --variants single --modes '' --select on
    python scripts/key_maps_probe.py --key-maps maps-S15-plain.safetensors eval loss --maps \\
        maps-S15-ctx.safetensors --threads 1 --docs 3 --novel-docs 3 --modes ridge --select on
"""

from __future__ import annotations

import sys

import torch


def keys_from(key_maps):
    """A ``prefill`` that, for context maps in mode ``ridge``, writes the filled rows' keys from ``key_maps``."""
    from ridgefill.adapters import adapter_for
    from ridgefill.fill import predict_inputs, prefill

    @torch.no_grad()  # no autograd graph over the extra pass to h_S (eval loss runs outside inference mode)
    def probe_prefill(model, ids, maps=None, **kw):
        if maps is None or not maps.context or kw.get("kv_hook") is not None or kw.get("mode", "ridge") != "ridge":
            return prefill(model, ids, maps, **kw)
        kw.pop("kv_hook", None)  # None here: replaced by the probe's hook
        probe_prefill.changed += 1
        key_maps.check_model(model, maps.split)
        ad, split, n = adapter_for(model), maps.split, ids.shape[1]
        positions = torch.arange(n, device=ids.device)
        x = ad.embed(ids)
        rope = ad.rope(positions, x)
        for layer in range(split + 1):  # h_S, as the fill computes it
            shape = (ids.shape[0], ad.num_kv_heads, n, ad.head_dim)
            x = ad.layer(layer, x, rope, positions, x.new_empty(shape), x.new_empty(shape))
        cast = key_maps.to(x.dtype, x.device)
        w, b = cast.weights, cast.biases

        def hook(layer, k, v, rows):
            i = layer - split - 1
            keys, _ = ad.kv(layer, predict_inputs(x[:, rows], w[i], b[i]), rope.rows(rows))
            return keys, v

        return prefill(model, ids, maps, kv_hook=hook, **kw)

    probe_prefill.changed = 0  # fills whose keys the probe replaced
    return probe_prefill


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--key-maps" or argv[2] != "eval" or argv[3] not in ("needle", "loss"):
        print("usage: key_maps_probe.py --key-maps FILE eval {needle,loss} [eval options]", file=sys.stderr)
        return 2
    import ridgefill.evaluate.loss as loss
    import ridgefill.evaluate.needles as needles
    from ridgefill.cli import main as cli
    from ridgefill.errors import RidgeFillError
    from ridgefill.maps import load_maps

    try:
        key_maps = load_maps(argv[1])
    except RidgeFillError as e:
        print(f"--key-maps {argv[1]}: {e}", file=sys.stderr)
        return 2
    if key_maps.context or key_maps.kind != "inputs":
        print(f"--key-maps {argv[1]}: give input maps without context (ridgefill calibrate --context 0)", file=sys.stderr)
        return 2
    probe = loss.prefill = needles.prefill = keys_from(key_maps)
    rc = cli(argv[2:])
    if probe.changed == 0:
        print("key_maps_probe: no fill was changed (the probe acts on context maps in mode 'ridge' only: pass "
              "--maps with context maps and a ridge mode)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
