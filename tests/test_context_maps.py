"""Context maps: ridge maps whose input is ``[h_S(t), h_S(t−1)]`` (:func:`ridgefill.fill.context_features`).

Checked here: the features (shift, zeros before row 0, causality), the fill path with oracle context maps
(the exact cache, on the batched and the per-layer path, and a map reading the wrong block fails), the
calibration against a float64 ridge solved from the raw activations, the maps file round trip, the
certificate, the cost model and the errors (refit, bad context, shapes that do not fit).
"""

import pytest
import torch
from conftest import oracle_context_maps, reference, tiny_llama

from ridgefill import RidgeMaps, load_maps, prefill
from ridgefill.adapters import adapter_for
from ridgefill.calibrate import calibrate
from ridgefill.certify import layer_certificate
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
    ex = prefill(model, ids, mode="exact", tail=4)
    got = prefill(model, ids, oracle_context_maps(model, ids, S), tail=4, fast=fast, logits="exact")
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(got.cache.layers[layer].keys, ex.cache.layers[layer].keys, atol=5e-5, rtol=0)
        torch.testing.assert_close(got.cache.layers[layer].values, ex.cache.layers[layer].values, atol=5e-5, rtol=0)
    torch.testing.assert_close(got.logits[:, -1:], ex.logits, atol=5e-5, rtol=0)
    wrong = prefill(model, ids, oracle_context_maps(model, ids, S, swap=True), tail=4, fast=fast)
    late = model.config.num_hidden_layers - 1
    assert (wrong.cache.layers[late].keys - ex.cache.layers[late].keys).abs().max() > 1e-2


def test_calibrated_context_maps_match_a_float64_ridge(model, ctx_maps):
    """W_l solves (G + λI) W = B + λ [I; 0] on the centred features [h_S(t), h_S(t−1)] of every chunk row
    (held-out chunks included: the final refit), b_l = x̄ − f̄ W, computed here from raw activations."""
    d, late = model.config.hidden_size, model.config.num_hidden_layers - S - 1
    assert ctx_maps.context == 1 and ctx_maps.meta["context"] == 1
    assert ctx_maps.weights.shape == (late, 2 * d, d) and ctx_maps.mean_h.shape == (d,)
    assert ctx_maps.cov_h.shape == (d, d)
    from ridgefill.calibrate import calibration_chunks

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
        w = torch.linalg.solve(fc.T @ fc + lam * torch.eye(2 * d, dtype=torch.float64), fc.T @ xc + lam * prior)
        b = x[i].mean(0) - f.mean(0) @ w
        torch.testing.assert_close(ctx_maps.weights[i].double(), w, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(ctx_maps.biases[i].double(), b, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(ctx_maps.mean_h.double(), f[:, :d].mean(0), atol=1e-5, rtol=1e-5)


def test_context_maps_file_round_trip_and_certificate(tmp_path, model, ctx_maps):
    path = tmp_path / "ctx.safetensors"
    ctx_maps.save(path)
    back = attach_stats(load_maps(path), path)
    assert back.context == 1 and back.stats.context == 1 and back.stats.features == 2 * model.config.hidden_size
    assert torch.equal(back.weights, ctx_maps.weights)
    back.check_model(model, S)
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    a, b = prefill(model, ids, ctx_maps, tail=3), prefill(model, ids, back, tail=3)
    assert torch.equal(a.logits, b.logits)
    cert = layer_certificate(back.stats, 0, back.weights[0], back.lambdas[0])
    assert cert["passed"], cert
    bad = layer_certificate(back.stats, 0, back.weights[0] * 1.01, back.lambdas[0])
    assert not bad["passed"]
    # a file whose context does not match its weights' width is refused, and so are such maps for a model
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["ridgefill"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    meta["context"] = 0
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={"ridgefill": json.dumps(meta)})
    with pytest.raises(MapsFormatError, match="inconsistent shapes"):
        load_maps(tmp_path / "bad.safetensors")
    plain = RidgeMaps(S, ctx_maps.weights, ctx_maps.biases, ctx_maps.lambdas, dict(ctx_maps.meta, context=0))
    with pytest.raises(MapsMismatchError, match="needs"):
        plain.check_model(model, S)


def test_context_maps_refuse_refit_and_fill_all_modes(model, ctx_maps):
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(4))
    with pytest.raises(InputError, match="context maps"):
        prefill(model, ids, ctx_maps, tail=3, refit=1.0)
    ex = prefill(model, ids, mode="exact", tail=3)
    for mode in ("ridge", "centred", "identity", "none"):  # centred and identity read h_S alone
        res = prefill(model, ids, ctx_maps, tail=3, mode=mode)
        assert res.logits.shape == ex.logits.shape and torch.isfinite(res.logits).all()
    whole = prefill(model, ids, ctx_maps, tail=30)  # every row exact: the maps are never used
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
    a = prefill(model, ids, ctx_maps, tail=5, fast=True)
    b = prefill(model, ids, ctx_maps, tail=5, fast=False)
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
    assert torch.equal(prefill(model, ids, back, tail=3).logits, prefill(model, ids, kv, tail=3).logits)
