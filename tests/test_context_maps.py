"""Context maps: ridge maps whose input is ``[h_S(t), h_S(t−1)]`` (:func:`ridgefill.fill.context_features`).

Checked here: the features (shift, zeros before row 0, causality), the fill path with oracle context maps
(the exact cache, on the batched and the per-layer path, and a map reading the wrong block fails), the
calibration against a float64 ridge solved from the raw activations, the maps file round trip, the
certificate, the cost model and the errors (bad context, shapes that do not fit).
"""

import pytest
import torch
from conftest import oracle_context_maps, reference, tiny_llama

from ridgefill import RidgeMaps, load_maps, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import adapter_for
from ridgefill.calibration import calibrate
from ridgefill.certify import as_solved, certify_maps, check_certificate, layer_certificate, read_certificate
from ridgefill.costs import ModelShape, fill_cost, ideal_ratio
from ridgefill.errors import InputError, MapsFormatError, MapsMismatchError
from ridgefill.fill import context_features
from ridgefill.maps import attach_stats

S = 2


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 101 for c in text]}


TEXT = "".join(chr(97 + (i * 7 + i // 13) % 26) + (" " if i % 5 == 4 else "") for i in range(3000))


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3)


@pytest.fixture(scope="module")
def ctx_maps(model):
    return calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=1024, chunk=128, progress=False, context=1)


def test_context_features_shift_rows_and_pad_row_zero():
    h = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    f = context_features(h, 1)
    assert f.shape == (2, 5, 6)
    assert torch.equal(f[..., :3], h)
    assert torch.equal(f[:, 1:, 3:], h[:, :-1])
    assert torch.equal(f[:, 0, 3:], torch.zeros(2, 3))
    assert context_features(h, 0) is h
    changed = h.clone()
    changed[:, 3:] += 100.0  # rows after t = 2 change: features of rows ≤ 2 do not
    assert torch.equal(context_features(changed, 1)[:, :3], f[:, :3])
    assert not torch.equal(context_features(changed, 1)[:, 3], f[:, 3])
    for bad in (2, -1, True, 0.5):
        with pytest.raises(InputError, match="context"):
            context_features(h, bad)


@pytest.mark.parametrize("fast", [True, False])
def test_oracle_context_maps_give_the_exact_cache(model, fast):
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(5))
    ex = prefill(model, ids, mode="exact", tail=4, select=None)
    got = prefill_instrumented(model, ids, oracle_context_maps(model, ids, S), tail=4, fast=fast, logits="exact", select=None)
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(got.cache.layers[layer].keys, ex.cache.layers[layer].keys, atol=5e-5, rtol=0)
        torch.testing.assert_close(got.cache.layers[layer].values, ex.cache.layers[layer].values, atol=5e-5, rtol=0)
    torch.testing.assert_close(got.logits[:, -1:], ex.logits, atol=5e-5, rtol=0)
    wrong = prefill_instrumented(model, ids, oracle_context_maps(model, ids, S, swap=True), tail=4, fast=fast, select=None)
    late = model.config.num_hidden_layers - 1
    assert (wrong.cache.layers[late].keys - ex.cache.layers[late].keys).abs().max() > 1e-2


@pytest.fixture(scope="module")
def ctx_maps_alpha4(model):
    return calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=1024, chunk=128, progress=False, context=1,
                     context_penalty=4)


@pytest.mark.parametrize("which", ["default", "alpha4"])
def test_calibrated_context_maps_match_a_float64_ridge(model, ctx_maps, ctx_maps_alpha4, which):
    """W_l solves (G + λ diag(1, α)) W = B + λ [I; 0] on the centred features [h_S(t), h_S(t−1)] of every
    chunk row (held-out chunks included: the final refit), b_l = x̄ − f̄ W, computed here from raw
    activations: α = 1 (the default context penalty, one λ) and α = 4 (the previous row's block penalised 4λ)."""
    ctx_maps = ctx_maps if which == "default" else ctx_maps_alpha4
    alpha = 1.0 if which == "default" else 4.0
    assert ctx_maps.context_penalty == alpha and ctx_maps.meta["context_penalty"] == alpha
    d, late = model.config.hidden_size, model.config.num_hidden_layers - S - 1
    assert ctx_maps.context == 1 and ctx_maps.meta["context"] == 1
    assert ctx_maps.weights.shape == (late, 2 * d, d) and ctx_maps.mean_h.shape == (d,)
    assert ctx_maps.cov_h.shape == (d, d)
    from ridgefill.calibration import calibration_chunks

    feats, xs = [], []
    for c in calibration_chunks(CharTokenizer(), [TEXT], 1024, 128):
        out = reference(model, c[None])
        feats.append(context_features(out.hidden_states[S + 1][0].double(), 1))
        xs.append(torch.stack([out.hidden_states[layer][0].double() for layer in range(S + 1, S + 1 + late)]))
    f, x = torch.cat(feats), torch.cat(xs, 1)
    fc = f - f.mean(0)
    prior = torch.cat([torch.eye(d), torch.zeros(d, d)]).double()
    for i in range(late):
        lam = ctx_maps.lambdas[i]
        xc = x[i] - x[i].mean(0)
        pen = torch.cat([torch.ones(d), torch.full((d,), alpha)]).double()
        w = torch.linalg.solve(fc.T @ fc + lam * torch.diag(pen), fc.T @ xc + lam * prior)
        b = x[i].mean(0) - f.mean(0) @ w
        torch.testing.assert_close(ctx_maps.weights[i].double(), w, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(ctx_maps.biases[i].double(), b, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(ctx_maps.mean_h.double(), f[:, :d].mean(0), atol=1e-5, rtol=1e-5)


def test_context_maps_file_round_trip_and_certificate(tmp_path, model, ctx_maps, ctx_maps_alpha4):
    path = tmp_path / "ctx1.safetensors"  # α = 1: the raw statistics are the problem solved
    ctx_maps.save(path)
    back = attach_stats(load_maps(path), path)
    solved, weights = as_solved(back.stats, back)
    assert solved is back.stats and weights is back.weights and back.context_penalty == 1.0
    assert layer_certificate(back.stats, 0, back.weights[0], back.lambdas[0])["passed"]
    ctx_maps = ctx_maps_alpha4
    path = tmp_path / "ctx.safetensors"
    ctx_maps.save(path)
    back = attach_stats(load_maps(path), path)
    assert back.context == 1 and back.stats.context == 1 and back.stats.features == 2 * model.config.hidden_size
    assert torch.equal(back.weights, ctx_maps.weights)
    back.check_model(model, S)
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    a, b = prefill(model, ids, ctx_maps, tail=3, select=None), prefill(model, ids, back, tail=3, select=None)
    assert torch.equal(a.logits, b.logits)
    solved, weights = as_solved(back.stats, back)  # the one-λ ridge on [h(t), h(t−1)/2] (α = 4)
    assert torch.equal(weights[0, :model.config.hidden_size], back.weights[0, :model.config.hidden_size].double())
    assert torch.equal(weights[0, model.config.hidden_size:], 2 * back.weights[0, model.config.hidden_size:].double())
    cert = layer_certificate(solved, 0, weights[0], back.lambdas[0])
    assert cert["passed"], cert
    bad = layer_certificate(solved, 0, weights[0] * 1.01, back.lambdas[0])
    assert not bad["passed"]
    # the raw statistics with the stored weights are not the problem these maps solve (α = 4, not 1)
    assert not layer_certificate(back.stats, 0, back.weights[0], back.lambdas[0])["passed"]
    paths = certify_maps(path, tmp_path / "certs")
    assert len(paths) == len(back.lambdas)
    for q in paths:
        c = read_certificate(q)
        assert c["context_penalty"] == 4.0 and check_certificate(c, back.stats, back).passed
    # a file whose context does not match its weights' width is refused, and so are such maps for a model
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["ridgefill"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    meta["context"] = 0
    meta.pop("context_penalty")
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={"ridgefill": json.dumps(meta)})
    with pytest.raises(MapsFormatError, match="inconsistent shapes"):
        load_maps(tmp_path / "bad.safetensors")
    plain = RidgeMaps(S, ctx_maps.weights, ctx_maps.biases, ctx_maps.lambdas, dict(ctx_maps.meta, context=0))
    with pytest.raises(MapsMismatchError, match="needs"):
        plain.check_model(model, S)


def test_context_maps_fill_all_modes(model, ctx_maps):
    """The ridge fill writes each filled row's K/V from x̂ = [h_S(t), h_S(t−1)] W_l + b_l through the layer's
    own norm, K/V projections and RoPE; centred, identity and none read h_S alone, so they equal the same
    modes with plain maps fitted on the same text; a tail covering the prompt is the exact prefill."""
    from ridgefill.maps import predict_inputs

    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(4))
    plain = calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=1024, chunk=128, progress=False, context=0)
    for mode in ("centred", "identity", "none"):
        a = prefill(model, ids, ctx_maps, tail=3, mode=mode, select=None)
        b = prefill(model, ids, plain, tail=3, mode=mode, select=None)
        torch.testing.assert_close(a.logits, b.logits, atol=0, rtol=0)
        for layer in range(model.config.num_hidden_layers):
            torch.testing.assert_close(a.cache.layers[layer].keys, b.cache.layers[layer].keys, atol=0, rtol=0)
    res = prefill(model, ids, ctx_maps, tail=3, select=None)
    ad = adapter_for(model)
    with torch.no_grad():
        h_split = model(ids, output_hidden_states=True).hidden_states[S + 1]  # the input of layer S + 1
        filled = torch.arange(ids.shape[1] - 3)
        feats = context_features(h_split, 1)[:, filled]
        rope = ad.rope(filled, h_split)
        for i, layer in enumerate(range(S + 1, model.config.num_hidden_layers)):
            k, v = ad.kv(layer, predict_inputs(feats, ctx_maps.weights[i], ctx_maps.biases[i]), rope)
            torch.testing.assert_close(res.cache.layers[layer].keys[:, :, filled], k, atol=2e-5, rtol=0)
            torch.testing.assert_close(res.cache.layers[layer].values[:, :, filled], v, atol=2e-5, rtol=0)
    assert (res.logits - prefill(model, ids, ctx_maps, tail=3, mode="identity", select=None).logits).abs().max() > 1e-4
    ex = prefill(model, ids, mode="exact", tail=3, select=None)
    whole = prefill(model, ids, ctx_maps, tail=30, select=None)  # every row exact: the maps are never used
    torch.testing.assert_close(whole.logits, ex.logits, atol=2e-5, rtol=0)


def test_cost_model_counts_the_wider_map():
    shape = ModelShape.from_config(tiny_llama(seed=3).config)
    d, late, n, tail = shape.hidden, shape.layers - S - 1, 200, 8
    plain, ctx = fill_cost(shape, n, S, tail), fill_cost(shape, n, S, tail, context=1)
    assert ctx.parts["maps"] - plain.parts["maps"] == late * (n - tail) * 2 * d * d
    assert ctx.flops - plain.flops == late * (n - tail) * 2 * d * d
    assert ideal_ratio(shape, n, S, tail, context=1) < ideal_ratio(shape, n, S, tail)
    with pytest.raises(InputError, match="context"):
        fill_cost(shape, n, S, tail, context=2)


def test_fill_kv_batched_path_reads_the_context_features(model, ctx_maps):
    """The batched fast path (one matmul over layers) and the per-layer path agree for [2d, d] maps."""
    ids = torch.randint(0, 101, (2, 50), generator=torch.Generator().manual_seed(6))
    a = prefill_instrumented(model, ids, ctx_maps, tail=5, fast=True, select=None)
    b = prefill_instrumented(model, ids, ctx_maps, tail=5, fast=False, select=None)
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(a.cache.layers[layer].keys, b.cache.layers[layer].keys, atol=2e-5, rtol=0)
    ad = adapter_for(model)
    assert ad.supports_fill_kv()


def test_save_refuses_weights_that_do_not_fit_the_context(tmp_path, ctx_maps):
    lying = RidgeMaps(S, ctx_maps.weights, ctx_maps.biases, ctx_maps.lambdas, dict(ctx_maps.meta, context=0))
    with pytest.raises(InputError, match="do not fit their kind 'inputs' and context 0"):
        lying.save(tmp_path / "lying.safetensors")
    assert not (tmp_path / "lying.safetensors").exists()


def test_kv_context_maps_with_held_out_chunks_round_trip(tmp_path, model):
    """K/V maps record no identity-fill error (None per layer); their file loads back (context maps too)."""
    kv = calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=1024, chunk=128, progress=False, targets="kv",
                   context=1)
    assert kv.meta["heldout_rel_error_identity"] == [None] * kv.weights.shape[0]
    kv.save(tmp_path / "kv.safetensors")
    back = load_maps(tmp_path / "kv.safetensors")
    assert back.kind == "kv" and back.context == 1 and torch.equal(back.weights, kv.weights)
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(8))
    assert torch.equal(prefill(model, ids, back, tail=3, select=None).logits, prefill(model, ids, kv, tail=3, select=None).logits)
    # selection: K/V maps predict no queries, so "auto" takes the two-pass selection and "on" (one pass) is refused
    long = torch.randint(0, 101, (1, 200), generator=torch.Generator().manual_seed(9))
    auto = prefill(model, long, back, tail=16).selected
    assert auto.numel() > 0 and torch.equal(auto, prefill(model, long, back, tail=16, select="two-pass").selected)
    with pytest.raises(InputError, match="K/V maps predict keys and values only.*two-pass"):
        prefill(model, long, back, tail=16, select="on")


def test_context_penalty_weighs_the_previous_row_block():
    """fit_maps(context_penalty=α) solves the normal equations of ‖F W − X‖² + λ‖W_h − I‖² + αλ‖W_p‖²
    (float64, random statistics); α = 1 is the one-λ ridge; a large α leaves the previous row's block near 0
    and the own block near the ridge on h_S alone; α ≤ 0, NaN, or α ≠ 1 without context are refused."""
    from ridgefill.ridge import RidgeStats, fit_maps

    g = torch.Generator().manual_seed(5)
    d, n = 6, 400
    h = torch.randn(n, d, generator=g, dtype=torch.float64)
    f = torch.cat([h, torch.cat([torch.zeros(1, d, dtype=torch.float64), h[:-1]])], 1)
    x = torch.stack([h @ torch.randn(d, d, generator=g, dtype=torch.float64) + 0.5 * f[:, d:] + 0.1 * torch.randn(n, d, generator=g, dtype=torch.float64)
                     for _ in range(2)])
    st = RidgeStats(2, d, context=1)
    st.update(f, x)
    plain = RidgeStats(2, d)
    plain.update(h, x)
    lam, prior = 30.0, torch.cat([torch.eye(d), torch.zeros(d, d)]).double()
    fc = f - f.mean(0)
    for alpha in (0.25, 1.0, 4.0, 100.0):
        fit = fit_maps(st, lam, context_penalty=alpha)
        assert fit.context_penalty == alpha and fit.stats is st
        pen = torch.diag(torch.cat([torch.ones(d), torch.full((d,), alpha)]).double())
        for i in range(2):
            xc = x[i] - x[i].mean(0)
            grad = fc.T @ (fc @ fit.weights[i] - xc) + lam * pen @ (fit.weights[i] - prior)
            assert grad.abs().max() < 1e-8 * (fc.T @ xc).abs().max()
            torch.testing.assert_close(fit.biases[i], x[i].mean(0) - f.mean(0) @ fit.weights[i])
    one = fit_maps(st, lam)
    torch.testing.assert_close(fit_maps(st, lam, context_penalty=1.0).weights, one.weights, rtol=0, atol=0)
    big = fit_maps(st, lam, context_penalty=1e6).weights
    assert big[:, d:].abs().max() < 1e-4 * one.weights[:, d:].abs().max()
    torch.testing.assert_close(big[:, :d], fit_maps(plain, lam).weights, atol=1e-4, rtol=1e-4)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-30, True, "4", None):
        with pytest.raises(InputError, match="context penalty"):
            fit_maps(st, lam, context_penalty=bad)
    # the scaled copy shares no tensor with the statistics it came from
    scaled = st.with_context_scale(0.5)
    before = st.sum_x.clone()
    scaled.update(f[:3] * torch.tensor([1.0] * d + [0.5] * d, dtype=torch.float64), x[:, :3])
    assert torch.equal(st.sum_x, before)
    with pytest.raises(InputError, match="without context"):
        fit_maps(plain, lam, context_penalty=4.0)


def test_calibrate_records_the_context_penalty_and_refuses_it_without_context(model, tmp_path):
    from ridgefill.calibration import CONTEXT_PENALTY, resolve_context_penalty

    assert resolve_context_penalty(1, None) == CONTEXT_PENALTY == 1.0 and resolve_context_penalty(0, None) == 1.0
    assert resolve_context_penalty(1, 2) == 2.0 and resolve_context_penalty(0, 1) == 1.0
    with pytest.raises(InputError, match="without context"):
        calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=256, chunk=128, progress=False, context=0,
                  context_penalty=4)
    with pytest.raises(InputError, match="context penalty"):
        resolve_context_penalty(1, 0)
    plain = calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=256, chunk=128, progress=False, lam=1.0, context=0)
    assert "context_penalty" not in plain.meta and plain.context_penalty == 1.0
    bad = RidgeMaps(S, plain.weights, plain.biases, plain.lambdas, dict(plain.meta, context_penalty=4.0))
    with pytest.raises(InputError, match="without context"):
        bad.save(tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    # a file that records a penalty without context is refused on load
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    plain.save(tmp_path / "plain.safetensors")
    with safe_open(str(tmp_path / "plain.safetensors"), framework="pt") as fh:
        meta = json.loads(fh.metadata()["ridgefill"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    for value, why in ((4.0, "without context"), (-1, "context_penalty"), ("x", "context_penalty")):
        save_file(tensors, str(tmp_path / "bad2.safetensors"),
                  metadata={"ridgefill": json.dumps(dict(meta, context_penalty=value))})
        with pytest.raises(MapsFormatError, match=why):
            load_maps(tmp_path / "bad2.safetensors")


@pytest.mark.parametrize("alpha", [3.0, 4.0])
def test_penalised_maps_certify_and_refit_lambda_keeps_the_penalty(tmp_path, model, alpha):
    """α = 3 (not a power of 4: the scaling rounds) with λ = auto certifies from the saved raw statistics,
    and a λ re-solve (eval --lam-factors) keeps the penalty: factor 1 gives the same maps."""
    from ridgefill.evaluate.splice import refit_lambda

    maps = calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=1024, chunk=128, progress=False, context=1,
                     context_penalty=alpha)
    path = tmp_path / "m.safetensors"
    maps.save(path)
    for q in certify_maps(path, tmp_path / "certs"):
        c = read_certificate(q)
        assert c["passed"], (q.name, c)
    back = attach_stats(load_maps(path), path)
    again = refit_lambda(back, 1.0)
    torch.testing.assert_close(again.weights, back.weights, atol=1e-6, rtol=1e-5)
    assert again.context_penalty == alpha
