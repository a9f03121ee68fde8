"""The eighteenth session's probe scripts (docs/evaluate.md, "Eighteenth session"):
``scripts/key_maps_probe.py`` writes the filled rows' keys from the key maps and their values from the
context maps, and ``scripts/context_penalty_heldout.py`` reports the held-out error a penalised fit has."""

import pytest
import torch
from conftest import oracle_context_maps, script_module, tiny_llama

from ridgefill import RidgeMaps, prefill
from ridgefill.errors import MapsMismatchError
from ridgefill.ridge import RidgeStats, fit_maps, lambda_grid

S = 2


def _late(res, layer):
    c = res.cache.layers[layer]
    return c.keys, c.values


def test_key_maps_probe_takes_keys_from_the_key_maps_and_values_from_the_context_maps():
    probe = script_module("key_maps_probe")
    model = tiny_llama(seed=4)
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(6))
    d, tail = model.config.hidden_size, 6
    ctx = oracle_context_maps(model, ids, S)
    g = torch.Generator().manual_seed(7)
    plain = RidgeMaps(S, ctx.weights[:, :d] + 0.05 * torch.randn(ctx.weights[:, :d].shape, generator=g),
                      ctx.biases.clone(), list(ctx.lambdas))
    scattered = [0, 7, 8, 20]  # exact rows between filled ones: the hook gets a subset of the rows
    n = ids.shape[1]
    filled = torch.tensor([r for r in range(n - tail) if r not in scattered])
    probe_prefill = probe.keys_from(plain)
    got = probe_prefill(model, ids, ctx, tail=tail, mode="ridge", exact_rows=scattered)
    assert probe_prefill.changed == 1
    with_ctx = prefill(model, ids, ctx, tail=tail, mode="ridge", exact_rows=scattered)
    with_plain = prefill(model, ids, plain, tail=tail, mode="ridge", exact_rows=scattered)
    for layer in range(S + 1, model.config.num_hidden_layers):
        k, v = _late(got, layer)
        torch.testing.assert_close(k[:, :, filled], _late(with_plain, layer)[0][:, :, filled], atol=2e-5, rtol=0)
        torch.testing.assert_close(v[:, :, filled], _late(with_ctx, layer)[1][:, :, filled], atol=2e-5, rtol=0)
    last = model.config.num_hidden_layers - 1  # the keys really differ between the two maps
    assert (_late(with_ctx, last)[0] - _late(with_plain, last)[0])[:, :, filled].abs().max() > 1e-3
    # maps without context, the exact prefill and a caller's own hook are left as they are (and not counted)
    torch.testing.assert_close(probe_prefill(model, ids, plain, tail=tail, mode="ridge", exact_rows=scattered).logits,
                               with_plain.logits, atol=0, rtol=0)
    torch.testing.assert_close(probe_prefill(model, ids, ctx, tail=tail, mode="exact").logits,
                               prefill(model, ids, tail=tail, mode="exact").logits, atol=0, rtol=0)
    hook = lambda layer, k, v, rows: (k * 0, v)  # noqa: E731
    mine = probe_prefill(model, ids, ctx, tail=tail, mode="ridge", kv_hook=hook)
    assert _late(mine, S + 1)[0][:, :, :n - tail].abs().max() == 0
    assert probe_prefill.changed == 1
    with pytest.raises(MapsMismatchError, match="split"):  # key maps of another split
        probe.keys_from(RidgeMaps(S + 1, plain.weights[1:], plain.biases[1:], plain.lambdas[1:]))(
            model, ids, ctx, tail=tail, mode="ridge")


def test_context_penalty_sweep_reports_the_held_out_error_of_the_penalised_fit():
    sweep = script_module("context_penalty_heldout").sweep
    g = torch.Generator().manual_seed(8)
    d = 5

    def rows(n):
        h = torch.randn(n, d, generator=g, dtype=torch.float64)
        f = torch.cat([h, torch.cat([torch.zeros(1, d, dtype=torch.float64), h[:-1]])], 1)
        x = torch.stack([h @ torch.randn(d, d, generator=g, dtype=torch.float64) + 0.3 * f[:, d:]
                         + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2)])
        st = RidgeStats(2, d, context=1)
        st.update(f, x)
        return st, f, x

    fit, _, _ = rows(300)
    held, f_out, x_out = rows(120)
    alphas = [1.0, 4.0, 16.0]
    out = sweep(fit, held, alphas, points=41)
    assert [r["layer"] for r in out] == [0, 1]
    for i, r in enumerate(out):
        for a in alphas:  # the reported error is that of fit_maps' penalised map on the held-out rows
            lam = r["lambda"][a]
            maps = fit_maps(fit, [lam, lam], context_penalty=a)
            pred = f_out @ maps.weights[i] + maps.biases[i]
            err = float((x_out[i] - pred).square().sum())
            assert r["error"][a] == pytest.approx(err, rel=1e-9)
            assert r["error_rel_to_alpha_1"][a] == pytest.approx(err / r["error"][1.0], rel=1e-12)
        assert r["best_alpha"] == min(alphas, key=lambda a: r["error"][a])
        # each λ is the grid's best for its α: its neighbours on the grid are no better
        grid = lambda_grid(fit.centred(i)[0], points=41).tolist()
        for a in alphas:
            j = grid.index(r["lambda"][a])
            for other in grid[max(j - 1, 0):j] + grid[j + 1:j + 2]:
                maps = fit_maps(fit, [other, other], context_penalty=a)
                worse = float((x_out[i] - (f_out @ maps.weights[i] + maps.biases[i])).square().sum())
                assert worse >= r["error"][a] * (1 - 1e-9)


def test_heldout_maps_take_each_layers_best_alpha_and_lambda_and_check_the_statistics():
    script = script_module("context_penalty_heldout")
    g = torch.Generator().manual_seed(9)
    d = 4

    def stats(n):
        h = torch.randn(n, d, generator=g, dtype=torch.float64)
        f = torch.cat([h, torch.cat([torch.zeros(1, d, dtype=torch.float64), h[:-1]])], 1)
        x = torch.stack([h @ torch.randn(d, d, generator=g, dtype=torch.float64) + s * f[:, d:]
                         + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64) for s in (0.05, 0.8, 0.3)])
        st = RidgeStats(3, d, context=1)
        st.update(f, x)
        return st

    fit, held = stats(300), stats(100)
    auto = fit_maps(fit, "auto", held)
    like = RidgeMaps(2, auto.weights.float(), auto.biases.float(), auto.lambdas, {"context": 1, "model_name": "m"})
    alphas = [1.0, 4.0, 64.0]
    rows = script.sweep(fit, held, alphas, points=41)
    assert len({r["best_alpha"] for r in rows}) > 1  # layers choosing different α: one fit per α, mixed
    maps = script.heldout_maps(fit, held, rows, like)
    assert maps.meta["heldout_alpha"] == [r["best_alpha"] for r in rows] and maps.meta["model_name"] == "m"
    assert maps.context == 1 and "context_penalty" not in maps.meta
    merged = fit.merged(held)
    for i, r in enumerate(rows):
        lam = r["lambda"][r["best_alpha"]]
        one = fit_maps(merged, [lam] * 3, context_penalty=r["best_alpha"])
        assert maps.lambdas[i] == lam
        torch.testing.assert_close(maps.weights[i], one.weights[i].float(), atol=0, rtol=0)
        torch.testing.assert_close(maps.biases[i], one.biases[i].float(), atol=0, rtol=0)
    other = RidgeMaps(2, auto.weights.float() * 1.001, auto.biases.float(), auto.lambdas, {"context": 1})
    with pytest.raises(ValueError, match="not fitted on these statistics"):
        script.heldout_maps(fit, held, rows, other)
