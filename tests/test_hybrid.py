"""Hybrid models with recurrent-state layers (Qwen3-Next, Qwen3.5 text) on tiny random configs, CPU,
with the library's reference torch kernels (no download).

Six layers: linear-attention (Gated DeltaNet) layers 0, 2, 3, 5 and full-attention layers 1, 4; split
S = 1, so the late layers 2-5 mix recurrent and attention layers. Norm weights and gates are random.
References: the ``transformers`` forward, its cache (conv and delta-rule states), ``model.generate``,
and the layer's own module run token by token (the recurrent kernel) for the state after filled rows.
"""

import pytest
import torch
from ridgefill import InputError, generate_after, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import HybridAdapter, adapter_for
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM

from conftest import oracle_context_maps, oracle_maps, reference

VOCAB, N, S = 101, 40, 1
TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention",
         "linear_attention"]
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=len(TYPES),
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
              linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
              layer_types=TYPES, max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=0,
              eos_token_id=1, bos_token_id=2, initializer_range=0.1)  # states ~0.1 (0.003 at the default 0.02)
FAMILIES = {
    "qwen3_next": lambda: Qwen3NextForCausalLM(Qwen3NextConfig(
        **COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "qwen3_5_text": lambda: Qwen3_5ForCausalLM(Qwen3_5TextConfig(**COMMON)),
}
RECURRENT = [i for i, t in enumerate(TYPES) if t == "linear_attention"]
_MODELS: dict = {}


def build(name):
    if name not in _MODELS:
        torch.manual_seed(0)
        model = FAMILIES[name]().eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(0.3 * torch.randn_like(p))
                elif pname.endswith("A_log"):  # slow decay (A in [0.01, 0.1]): the state remembers the filled rows
                    p.copy_(torch.empty_like(p).uniform_(0.01, 0.1).log())
        _MODELS[name] = model
    return _MODELS[name]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))


def assert_cache_close(a, b, atol):
    """Attention layers: K/V; recurrent layers: conv state and delta-rule state."""
    assert len(a.layers) == len(b.layers)
    for layer, (x, y) in enumerate(zip(a.layers, b.layers)):
        if layer in RECURRENT:
            torch.testing.assert_close(x.conv_states[0], y.conv_states[0], rtol=0, atol=atol)
            torch.testing.assert_close(x.recurrent_states[0], y.recurrent_states[0], rtol=0, atol=atol)
        else:
            torch.testing.assert_close(x.keys, y.keys, rtol=0, atol=atol)
            torch.testing.assert_close(x.values, y.values, rtol=0, atol=atol)


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_by_layer_equals_transformers(name, ids):
    model = build(name)
    ad = adapter_for(model)
    assert type(ad) is HybridAdapter and list(ad.recurrent_layers) == RECURRENT and not ad.supports_fill_kv()
    out = reference(model, ids)
    pos = torch.arange(N)
    with torch.no_grad():
        x = ad.embed(ids)
        rope = ad.rope(pos, x)
        state = ad.new_state()
        for layer in range(len(TYPES)):
            if ad.is_recurrent(layer):
                x = ad.layer(layer, x, rope, pos, state, None)
            else:
                k, v = x.new_empty(2, 2, N, 16), x.new_empty(2, 2, N, 16)
                x = ad.layer(layer, x, rope, pos, k, v)
                kk, vv = ad.kv(layer, out.hidden_states[layer], rope)
                torch.testing.assert_close(k, out.cache.layers[layer].keys, rtol=0, atol=1e-5)
                torch.testing.assert_close(kk, k, rtol=0, atol=1e-5)
                torch.testing.assert_close(vv, v, rtol=0, atol=1e-5)
            if layer < len(TYPES) - 1:
                torch.testing.assert_close(x, out.hidden_states[layer + 1], rtol=0, atol=1e-5)
        torch.testing.assert_close(ad.logits(x), out.logits, rtol=0, atol=1e-5)
    for layer in RECURRENT:
        torch.testing.assert_close(state.layers[layer].recurrent_states[0], out.cache.layers[layer].recurrent_states[0],
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_state_after_filled_rows_equals_recurrence_on_their_inputs(name, ids):
    """advance_state on F rows gives the conv and delta-rule states of (a) the transformers forward on
    those rows (true inputs), (b) the layer's own module run one row at a time (the recurrent kernel
    and the conv update step) on predicted inputs, and (c) itself over the rows in two runs."""
    model = build(name)
    ad = adapter_for(model)
    f = 23
    out = reference(model, ids[:, :f])
    x_hat = torch.randn(2, f, 64, generator=torch.Generator().manual_seed(4))
    for layer in RECURRENT:
        state = ad.new_state()
        ad.advance_state(layer, out.hidden_states[layer], state)
        torch.testing.assert_close(state.layers[layer].conv_states[0], out.cache.layers[layer].conv_states[0],
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(state.layers[layer].recurrent_states[0],
                                   out.cache.layers[layer].recurrent_states[0], rtol=0, atol=1e-5)
        state = ad.new_state()
        ad.advance_state(layer, x_hat, state)
        step = ad.new_state()
        block = model.model.layers[layer]
        with torch.no_grad():
            h = block.input_layernorm(x_hat)
            for t in range(f):
                block.linear_attn(h[:, t:t + 1], cache=step)
        torch.testing.assert_close(state.layers[layer].conv_states[0], step.layers[layer].conv_states[0],
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(state.layers[layer].recurrent_states[0], step.layers[layer].recurrent_states[0],
                                   rtol=0, atol=1e-5)
        assert state.layers[layer].recurrent_states[0].abs().max() > 1e-2
        parts = ad.new_state()  # continued: rows 0..9, then 10..f-1 from the state the first run left
        ad.advance_state(layer, x_hat[:, :10], parts)
        ad.advance_state(layer, x_hat[:, 10:], parts)
        torch.testing.assert_close(parts.layers[layer].conv_states[0], state.layers[layer].conv_states[0],
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(parts.layers[layer].recurrent_states[0], state.layers[layer].recurrent_states[0],
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_exact_mode_equals_transformers_forward(name, ids):
    model = build(name)
    out = reference(model, ids)
    res = prefill_instrumented(model, ids, tail=N, mode="exact", logits="exact", select=None)
    assert torch.equal(res.logits, out.logits)
    assert_cache_close(res.cache, out.cache, atol=0)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["identity", "none", "ridge"])
def test_tail_whole_prompt_equals_exact(name, ids, mode):
    model = build(name)
    exact = prefill_instrumented(model, ids, tail=N, mode="exact", logits="exact", select=None)
    maps = oracle_maps(model, ids[:1], S) if mode == "ridge" else None
    res = prefill_instrumented(model, ids, maps, tail=N, mode=mode, split=S, logits="exact", select=None)
    torch.testing.assert_close(res.logits, exact.logits, rtol=0, atol=1e-5)
    assert_cache_close(res.cache, exact.cache, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("tail", [1, 5])
def test_oracle_fill_equals_exact_prefill(name, ids, tail):
    """Filled rows with their true late-layer inputs: recurrent states, K/V and the exact rows' logits
    equal the exact prefill's; the identity fill's do not."""
    model = build(name)
    one = ids[:1]
    maps = oracle_maps(model, one, S)
    exact = prefill_instrumented(model, one, tail=N, mode="exact", logits="exact", select=None)
    res = prefill_instrumented(model, one, maps, tail=tail, mode="ridge", logits="exact", select=None)
    torch.testing.assert_close(res.logits, exact.logits[:, -tail:], rtol=0, atol=1e-5)
    assert_cache_close(res.cache, exact.cache, atol=1e-5)
    ident = prefill_instrumented(model, one, tail=tail, mode="identity", split=S, logits="exact", select=None)
    last = RECURRENT[-1]
    assert (ident.cache.layers[last].recurrent_states[0] - exact.cache.layers[last].recurrent_states[0]).abs().max() > 1e-3


@pytest.mark.parametrize("name", FAMILIES)
def test_none_mode_exact_rows_start_from_empty_state(name, ids):
    """Mode none: filled rows do not advance a late recurrent layer; its state is that of the exact
    rows alone (equal to running that layer on the tail's inputs from an empty state)."""
    model = build(name)
    res = prefill(model, ids, tail=6, mode="none", split=S, select=None)
    ident = prefill(model, ids, tail=6, mode="identity", split=S, select=None)
    for layer in RECURRENT:
        a, b = res.cache.layers[layer].recurrent_states[0], ident.cache.layers[layer].recurrent_states[0]
        if layer <= S:
            assert torch.equal(a, b)
        else:
            assert (a - b).abs().max() > 1e-3


def test_kv_hook_and_two_pass_selection_are_refused(ids):
    model = build("qwen3_next")
    maps = oracle_maps(model, ids[:1], S)
    with pytest.raises(InputError, match="kv_hook"):
        prefill_instrumented(model, ids, tail=4, mode="identity", split=S, kv_hook=lambda layer, k, v, f: (k, v), select=None)
    with pytest.raises(InputError, match="use the one-pass selection"):
        prefill(model, ids[:1], maps, tail=4, select="two-pass")
    assert prefill(model, ids[:1], maps, tail=4, select="on").selected is not None  # "on" is the one-pass selection


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["ridge", "identity", "none"])
def test_exact_rows_inside_the_prompt_equal_the_recurrence_in_order(name, ids, mode):
    """Exact rows anywhere: each late recurrent layer runs filled runs and exact runs in order. With the
    oracle maps every filled row's late-layer input is exact, so the exact rows' logits and the cache equal
    exact prefill's; other modes equal the same fill computed run by run with a tail (``check``)."""
    model = build(name)
    one = ids[:1]
    rows = [5, 6, 7, 20, 31]
    maps = oracle_maps(model, one, S) if mode == "ridge" else None
    res = prefill_instrumented(model, one, maps, tail=4, exact_rows=rows, mode=mode, split=S, logits="exact",
                               select=None)
    assert res.exact_positions.tolist() == rows + list(range(N - 4, N))
    if mode == "ridge":
        exact = prefill_instrumented(model, one, tail=N, mode="exact", logits="exact", select=None)
        torch.testing.assert_close(res.logits, exact.logits[:, res.exact_positions], rtol=0, atol=2e-5)
        assert_cache_close(res.cache, exact.cache, atol=2e-5)
    else:  # the first exact run (5..7) is the tail of the prompt cut after row 7
        cut = prefill_instrumented(model, one[:, :8], tail=3, mode=mode, split=S, logits="exact", select=None)
        torch.testing.assert_close(res.logits[:, :3], cut.logits, rtol=0, atol=1e-5)
        plain = prefill_instrumented(model, one, tail=4, mode=mode, split=S, logits="exact", select=None)
        assert (res.logits[:, -1] - plain.logits[:, -1]).abs().max() > 1e-4  # the exact rows changed the state


LONG = 160


@pytest.fixture(scope="module")
def repeat_ids():
    """A prompt whose tail (its last 16 rows) repeats rows 60..67 of the filled region."""
    ids = torch.randint(3, VOCAB, (1, LONG), generator=torch.Generator().manual_seed(7))
    ids[0, LONG - 12:LONG - 4] = ids[0, 60:68]
    return ids


@pytest.mark.parametrize("name", FAMILIES)
def test_default_selection_is_one_pass_and_equals_its_rows_given_as_exact_rows(name, repeat_ids):
    """``select`` left at its default on a hybrid model runs the one-pass selection; its prefill equals the
    prefill with the chosen rows given as ``exact_rows`` (the same computation: logits bit for bit); the
    repeated span's rows are chosen."""
    model = build(name)
    maps = oracle_maps(model, repeat_ids, S)  # not interpolating at 160 rows: a fitted-like map
    res = prefill_instrumented(model, repeat_ids, maps, tail=16, logits="exact")
    chosen = res.selected.tolist()
    assert chosen and set(range(60, 68)) & set(chosen) and max(chosen) < LONG - 16
    same = prefill_instrumented(model, repeat_ids, maps, tail=16, exact_rows=chosen, logits="exact", select=None)
    assert torch.equal(res.exact_positions, same.exact_positions)
    torch.testing.assert_close(res.logits, same.logits, rtol=0, atol=1e-6)
    assert_cache_close(res.cache, same.cache, atol=1e-6)
    assert torch.equal(prefill(model, repeat_ids, maps, tail=16, select="one-pass").selected, res.selected)


@pytest.mark.parametrize("name", FAMILIES)
def test_generate_after_matches_model_generate(name, ids):
    model = build(name)
    one = ids[:1]
    with torch.no_grad():
        plain = model.generate(one, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=1)[:, N:]
    maps = oracle_maps(model, one, S)
    assert torch.equal(generate_after(model, one, prefill(model, one, tail=N, mode="exact", select=None), 16), plain)
    assert torch.equal(generate_after(model, one, prefill(model, one, maps, tail=5, mode="ridge", select=None), 16), plain)
    assert torch.equal(generate_after(model, one, prefill(model, one, tail=N, mode="identity", split=S, select=None), 16), plain)
    assert torch.equal(generate_after(model, one, prefill(model, one, tail=N, mode="exact", select=None), 1), plain[:, :1])


@pytest.mark.parametrize("name", FAMILIES)
def test_decode_step_after_full_tail_equals_exact_decoding(name, ids):
    model = build(name)
    exact = prefill(model, ids, tail=N, mode="exact", select=None)
    res = prefill(model, ids, tail=N, mode="identity", split=S, select=None)
    nxt = exact.logits.argmax(-1)
    with torch.inference_mode():  # the states were made in prefill's inference mode; decoding updates them in place
        want = model(nxt, cache=exact.cache, use_cache=True).logits
        got = model(nxt, cache=res.cache, use_cache=True).logits
        whole = model(torch.cat([ids, nxt], 1)).logits[:, -1:]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(want, whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_oracle_context_maps_fill_equals_exact_prefill(name, ids):
    """Context maps (input ``[h_S(t), h_S(t−1)]``) that interpolate the true late-layer inputs: the filled
    rows advance the recurrent states and write K/V from them, equal to the exact prefill; with the two
    feature blocks swapped they are not."""
    model = build(name)
    one = ids[:1]
    exact = prefill_instrumented(model, one, tail=N, mode="exact", logits="exact", select=None)
    res = prefill_instrumented(model, one, oracle_context_maps(model, one, S), tail=5, mode="ridge", logits="exact", select=None)
    torch.testing.assert_close(res.logits, exact.logits[:, -5:], rtol=0, atol=1e-5)
    assert_cache_close(res.cache, exact.cache, atol=1e-5)
    wrong = prefill(model, one, oracle_context_maps(model, one, S, swap=True), tail=5, mode="ridge", select=None)
    last = RECURRENT[-1]
    assert (wrong.cache.layers[last].recurrent_states[0] - exact.cache.layers[last].recurrent_states[0]).abs().max() > 1e-3


def test_calibration_runs_and_oracle_style_maps_fit(ids):
    """Calibration statistics come from the adapter's layer forward (recurrent layers from an empty
    state over the whole chunk); they equal the transformers forward's late-layer inputs."""
    from ridgefill.calibration import collect_stats_many

    model = build("qwen3_5_text")
    ad = adapter_for(model)
    out = reference(model, ids[:1])
    pos = torch.arange(N)
    with torch.no_grad():
        x = ad.embed(ids[:1])
        rope = ad.rope(pos, x)
        for layer in range(len(TYPES) - 1):
            x = ad.layer(layer, x, rope, pos, x.new_empty(1, 2, N, 16), x.new_empty(1, 2, N, 16))
            torch.testing.assert_close(x, out.hidden_states[layer + 1], rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="rows 0..N-1"):
            ad.layer(0, x[:, 1:], rope.rows(slice(1, None)), pos[1:], None, None)
    with pytest.raises(Exception, match="no keys/values"):
        ad.kv(0, x, rope)
    stats = collect_stats_many(model, [ids[0], ids[1]], [S], progress=False)
    fit, _ = stats[S]
    both = [reference(model, ids[i:i + 1]) for i in range(2)]
    h = torch.cat([o.hidden_states[S + 1][0] for o in both]).double() - fit.shift_h  # statistics are shifted
    last = torch.cat([o.hidden_states[len(TYPES) - 1][0] for o in both]).double() - fit.shift_x[-1]
    assert fit.count == 2 * N
    torch.testing.assert_close(fit.sum_h, h.sum(0), rtol=0, atol=1e-4)
    torch.testing.assert_close(fit.gram, h.T @ h, rtol=0, atol=1e-4)
    torch.testing.assert_close(fit.sum_x[-1], last.sum(0), rtol=0, atol=1e-4)


@pytest.mark.parametrize("mode", ["ridge", "identity", "none"])
def test_exact_rows_are_causal(ids, mode):
    """Changing the last prompt token changes the last exact row's logits and no earlier exact row's."""
    model = build("qwen3_next")
    maps = oracle_maps(model, ids[:1], S) if mode == "ridge" else None
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 5) % VOCAB
    a = prefill_instrumented(model, ids, maps, tail=6, mode=mode, split=S, logits="exact", select=None)
    b = prefill_instrumented(model, changed, maps, tail=6, mode=mode, split=S, logits="exact", select=None)
    # not bitwise: the MoE groups tokens by expert, so a changed route changes matmul shapes (rounding)
    torch.testing.assert_close(a.logits[:, :-1], b.logits[:, :-1], rtol=0, atol=1e-5)
    assert (a.logits[:, -1] - b.logits[:, -1]).abs().max() > 0.1


# ------------------------------------------------------------------------------------------------
# Splice tests of the recurrent state (ridgefill.evaluate.splice, `ridgefill eval splice`)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
def test_state_splice_reproduces_exact_when_attention_fill_is_exact(name):
    """S = 3: late layers 4 (attention) and 5 (recurrent). The identity fill's K/V at layer 4 = S + 1
    are exact (its input is h_S), so the fill's only error is layer 5's state; splicing the exact state
    after the filled rows gives the exact NLL, logits and cache (states included). Without the splice
    the fill is not exact."""
    from ridgefill.evaluate.loss import tail_nll
    from ridgefill.evaluate.splice import exact_states, splice_variants

    model = build(name)
    ad = adapter_for(model)
    doc = torch.randint(3, VOCAB, (N + 1,), generator=torch.Generator().manual_seed(7))
    tail, split = 8, 3
    exact_nll, _, exact = tail_nll(model, doc, tail=tail, mode="exact")
    exact_all = prefill_instrumented(model, doc[None, :-1], tail=N, mode="exact", logits="exact", select=None)
    fill_nll, _, _ = tail_nll(model, doc, tail=tail, mode="identity", split=split)
    assert (fill_nll - exact_nll).abs().max() > 1e-3
    variants = splice_variants(model, {split: None}, tail=tail, mode="identity")
    assert list(variants) == [f"{split}/identity+fill", f"{split}/identity+state"]
    torch.testing.assert_close(variants[f"{split}/identity+state"](doc, exact), exact_nll, rtol=0, atol=1e-5)
    torch.testing.assert_close(variants[f"{split}/identity+fill"](doc, exact), fill_nll, rtol=0, atol=0)
    ids = doc[None, :-1]
    states = exact_states(model, ids, N - tail, [5])
    with ad.spliced_states(states):
        res = prefill_instrumented(model, ids, tail=tail, mode="identity", split=split, logits="exact", select=None)
    assert not ad._spliced  # closed again
    torch.testing.assert_close(res.logits, exact_all.logits[:, -tail:], rtol=0, atol=1e-5)
    assert_cache_close(res.cache, exact_all.cache, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_state_errors(name, ids):
    """S = 1, identity fill: layer 2 = S + 1 gets its true inputs (h_S), so its state is exact after the
    filled rows and at the prompt's end; layers 3 and 5 are not. With maps that reproduce the true
    inputs every state is exact."""
    from ridgefill.evaluate.splice import state_errors

    model = build(name)
    one = ids[:1]
    errs = state_errors(model, one, tail=6, mode="identity", split=S)
    assert sorted(errs) == [2, 3, 5]
    keys = {"conv_after_filled", "recurrent_after_filled", "conv_prompt_end", "recurrent_prompt_end"}
    assert all(set(e) == keys for e in errs.values())
    assert max(errs[2].values()) < 1e-5
    for layer in (3, 5):
        assert errs[layer]["recurrent_after_filled"] > 1e-2 and errs[layer]["conv_after_filled"] > 1e-2
        assert errs[layer]["recurrent_prompt_end"] > 1e-3
    oracle = state_errors(model, one, tail=6, mode="ridge", maps=oracle_maps(model, one, S))
    assert max(max(e.values()) for e in oracle.values()) < 1e-4
    assert set(state_errors(model, one, tail=N, mode="identity", split=S)[3]) == {"conv_prompt_end",
                                                                                  "recurrent_prompt_end"}
    assert state_errors(model, one, tail=6, mode="identity", split=len(TYPES) - 2) == {5: state_errors(
        model, one, tail=6, mode="identity", split=len(TYPES) - 2)[5]}
    with pytest.raises(InputError, match="mode"):
        state_errors(model, one, tail=6, mode="none", split=S)


def test_splice_components_by_model_and_state_splice_errors(ids):
    from conftest import tiny_llama
    from ridgefill.evaluate.splice import COMPONENTS, components_for, exact_states, splice_variants

    model = build("qwen3_5_text")
    ad = adapter_for(model)
    assert components_for(model) == ("fill", "state") and components_for(tiny_llama()) == COMPONENTS
    with pytest.raises(InputError, match=r"\['kv'\] do not apply.*kv_hook"):
        splice_variants(model, {S: None}, tail=4, mode="identity", components=["fill", "kv"])
    with pytest.raises(InputError, match="no recurrent-state layers"):
        splice_variants(tiny_llama(), {S: None}, tail=4, mode="identity", components=["state"])
    with pytest.raises(InputError, match="one of"):
        splice_variants(model, {S: None}, tail=4, mode="identity", components=["states"])
    states = exact_states(model, ids, 10, [2, 3])
    assert states[2][0].shape == (2, 64 + 64, 4) and states[2][1].shape == (2, 4, 16, 16)
    with pytest.raises(InputError, match="no recurrent state"):
        exact_states(model, ids, 10, [1])
    with pytest.raises(InputError, match="rows"):
        exact_states(model, ids, 0, [2])
    with pytest.raises(ValueError, match="not a recurrent"):
        with ad.spliced_states({1: states[2]}):
            pass
    with pytest.raises(ValueError, match="conv state"):
        with ad.spliced_states({2: (states[2][0][..., :2], states[2][1])}):
            pass
    with ad.spliced_states(states):
        with pytest.raises(ValueError, match="already open"):
            with ad.spliced_states(states):
                pass
        with pytest.raises(ValueError, match="batch"):
            prefill(model, ids[:1], tail=30, mode="identity", split=S, select=None)
    assert not ad._spliced


def test_eval_splice_cli_on_a_hybrid_model(tmp_path, capsys):
    """`ridgefill eval splice` on a tiny hybrid saved as a directory: components fill and state, the
    state errors per late recurrent layer in the JSON and in the report."""
    import json

    from ridgefill.cli import main
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    torch.manual_seed(3)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**dict(COMMON, vocab_size=256)))
    model.save_pretrained(tmp_path / "model")
    PreTrainedTokenizerFast(tokenizer_object=tk).save_pretrained(tmp_path / "model")
    out = tmp_path / "out"
    args = ["eval", "splice", "--model", str(tmp_path / "model"), "--out", str(out), "--quiet", "--splits", "1",
            "--mode", "identity", "--docs", "1", "--novel-docs", "1", "--doc-tokens", "96", "--tail", "16",
            "--window", "4", "--tau", "0.5", "--resamples", "50"]
    assert main(args) == 0
    rep = json.loads((out / "splice.json").read_text())
    assert rep["components"] == ["fill", "state"]
    assert {r["variant"] for r in rep["summary"]} == {"1/identity+fill", "1/identity+state"}
    errs = rep["state_errors"]["1"]
    assert sorted(errs) == ["2", "3", "5"]
    assert errs["2"]["recurrent_after_filled"]["mean"] < 1e-5  # layer S + 1 gets its true inputs
    assert errs["3"]["recurrent_after_filled"]["mean"] > 1e-3 and len(errs["3"]["conv_prompt_end"]["documents"]) == 2
    capsys.readouterr()
    assert main(args + ["--components", "fill,k"]) == 2
    assert "['k'] do not apply" in capsys.readouterr().err
    assert main(["report", str(out / "splice.json"), "--out", str(out / "report")]) == 0
    md = (out / "report" / "report.md").read_text()
    assert "exact recurrent state" in md and "| 1 | 3 |" in md


def test_tune_offers_no_two_pass_setting_on_a_hybrid_model():
    """``ridgefill tune``'s settings on a model with recurrent-state layers: by default the plain fill and one-pass
    (two-pass dropped); a named two-pass setting is refused before the calibration pass, naming the fix."""
    from ridgefill.evaluate.tune import TUNE_SELECTS, selects_for
    from ridgefill.select import ONE_PASS_SELECT

    model = build("qwen3_next")
    assert "two-pass" in TUNE_SELECTS
    assert selects_for(model, None) == {"off": None, "one-pass": ONE_PASS_SELECT}
    assert list(selects_for(model, ("off", "on"))) == ["off", "one-pass"]  # 'on' is one pass
    with pytest.raises(InputError, match="two-pass runs two passes.*--selects off,one-pass"):
        selects_for(model, ("off", "two-pass"))
