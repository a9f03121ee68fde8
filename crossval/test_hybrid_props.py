"""Property tests of the fill in hybrid models' recurrent-state (linear-attention, Gated DeltaNet) layers.

Tiny random Qwen3.5 text and Qwen3-Next models (:data:`LAYOUTS`, hidden 32, CPU, the library's
reference torch kernels) with prompt, split, tail, fill mode and maps drawn by Hypothesis. The fill
(:func:`ridgefill.prefill`) is watched through its adapter (the cached
:class:`~ridgefill.adapters.HybridAdapter`'s ``advance_state`` and ``layer``): what it gave each late
recurrent layer and the state it left there. The reference is the layer's own ``transformers``
module run one row at a time from an empty cache: the conv update step and the *recurrent* delta-rule
kernel (``torch_recurrent_gated_delta_rule``), where the fill's filled rows use the chunked kernel.

- :func:`test_state_after_filled_rows_is_the_recurrence_on_predicted_inputs`: in every late recurrent
  layer ``l`` the filled rows' inputs are ``x̂_l = h_S W_l + b_l`` (``h_S`` from the ``transformers``
  forward), the conv and delta-rule states after them equal the module's recurrence on ``x̂_l``, and the
  state after the exact rows (the one handed to decoding) and the exact rows' outputs equal the
  decoder layer run row by row, continuing from that state.
- :func:`test_exact_rows_are_causal`: changing the tokens after row ``t`` changes no exact row
  ``<= t``'s logits, no attention layer's K/V of rows ``<= t``, and (when every filled row is ``<= t``)
  no state after the filled rows.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ridgefill import RidgeMaps, predict_inputs, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import adapter_for
from transformers import (
    DynamicCache,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from crossval import tally
from crossval.models import reference

VOCAB, HIDDEN = 53, 32
LIN, FULL = "linear_attention", "full_attention"
#: layer types of the drawn models: recurrent layers before and after the attention ones
LAYOUTS = ((LIN, FULL, LIN, LIN), (FULL, LIN, FULL, LIN, LIN))
FAMILIES = ("qwen3_5_text", "qwen3_next")
ATOL = 2e-5  # chunked vs recurrent kernel, adapter vs transformers layer code (float32, states ~0.1-1)
#: a quarter of the profile's examples (ci: 10 per test, about 5 s on two cores; thorough: 100)
EXAMPLES = max(2, settings.default.max_examples // 4)


@functools.cache
def tiny_hybrid(family: str, layout: int):
    """A float32 random hybrid model of ``family`` with layer types ``LAYOUTS[layout]``; norm weights
    perturbed and slow state decay, so the state remembers the filled rows."""
    types = list(LAYOUTS[layout])
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=len(types),
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_value_heads=2,
                  linear_num_key_heads=1, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4, layer_types=types, max_position_embeddings=128,
                  tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=0.1)
    torch.manual_seed(10 * layout + FAMILIES.index(family))
    if family == "qwen3_next":
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=16, shared_expert_intermediate_size=16))
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**common))
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 0.1).log())
    return model


@st.composite
def hybrid_prompts(draw):
    """``(model, ids [batch, N], split, tail, mode, maps)``: a split with at least one recurrent late
    layer; maps ``W = I + noise``, ``b`` small (mode ``ridge``) or the identity fill."""
    family = draw(st.sampled_from(FAMILIES), label="family")
    layout = draw(st.integers(0, len(LAYOUTS) - 1), label="layout")
    types = LAYOUTS[layout]
    last_lin = max(i for i, t in enumerate(types) if t == LIN)
    split = draw(st.integers(0, last_lin - 1), label="split")
    n = draw(st.integers(2, 24), label="rows")
    batch = draw(st.integers(1, 2), label="batch")
    ids = torch.tensor(draw(st.lists(st.lists(st.integers(3, VOCAB - 1), min_size=n, max_size=n),
                                     min_size=batch, max_size=batch), label="ids"))
    tail = draw(st.integers(1, n), label="tail")
    mode = draw(st.sampled_from(["ridge", "identity"]), label="mode")
    maps = None
    if mode == "ridge":
        seed = draw(st.integers(0, 2 ** 31 - 1), label="maps seed")
        g = torch.Generator().manual_seed(seed)
        late = len(types) - split - 1
        w = torch.eye(HIDDEN) + 0.2 * torch.randn(late, HIDDEN, HIDDEN, generator=g) / HIDDEN ** 0.5
        maps = RidgeMaps(split, w, 0.1 * torch.randn(late, HIDDEN, generator=g), [1.0] * late)
    return tiny_hybrid(family, layout), ids, split, tail, mode, maps


@contextlib.contextmanager
def watched(model):
    """Record what the fill hands the adapter's recurrent-state steps.

    Yields ``seen``: ``seen["advance"][l] = (x̂ [B, F, d], conv state, delta-rule state)`` right after
    the filled rows advanced layer ``l``; ``seen["layer"][l] = (x [B, E, d], output [B, E, d])`` of the
    rows run through recurrent layer ``l`` with a state cache (copies)."""
    ad = adapter_for(model)
    seen = {"advance": {}, "layer": {}}
    advance, layer = ad.advance_state, ad.layer

    def spy_advance(l, x, state):
        advance(l, x, state)
        entry = state.layers[l]
        seen["advance"][l] = (x.clone(), entry.conv_states[0].clone(), entry.recurrent_states[0].clone())

    def spy_layer(l, x, rope, positions, keys, values, visible=None, *, host=None):
        out = layer(l, x, rope, positions, keys, values, visible, host=host)
        if ad.is_recurrent(l) and hasattr(keys, "layers"):
            seen["layer"][l] = (x.clone(), out.clone())
        return out

    ad.advance_state, ad.layer = spy_advance, spy_layer
    try:
        yield seen
    finally:
        del ad.advance_state, ad.layer  # back to the class's methods


@torch.no_grad()
def recurrence(model, layer: int, filled: torch.Tensor, exact: torch.Tensor):
    """The layer's own ``transformers`` modules, one row at a time from an empty cache: the filled rows
    (inputs ``filled`` ``[B, F, d]``) through the input norm and the Gated DeltaNet module only (state,
    no output used), then the exact rows (``exact`` ``[B, E, d]``) through the whole decoder layer.

    Returns ``(states after the filled rows or None, final states, exact rows' outputs [B, E, d])``,
    states being ``(conv, delta-rule)``."""
    block = model.model.layers[layer]
    cache = DynamicCache(config=model.config)
    after = None
    h = block.input_layernorm(filled)
    for t in range(filled.shape[1]):
        block.linear_attn(h[:, t:t + 1], cache=cache)
    if filled.shape[1]:
        after = cache.layers[layer].conv_states[0].clone(), cache.layers[layer].recurrent_states[0].clone()
    outs = []
    for t in range(exact.shape[1]):
        out = block(exact[:, t:t + 1], position_embeddings=None, attention_mask=None, cache=cache)
        outs.append(out[0] if isinstance(out, tuple) else out)
    entry = cache.layers[layer]
    return after, (entry.conv_states[0], entry.recurrent_states[0]), torch.cat(outs, 1)


@settings(max_examples=EXAMPLES)
@given(hybrid_prompts())
def test_state_after_filled_rows_is_the_recurrence_on_predicted_inputs(drawn):
    model, ids, split, tail, mode, maps = drawn
    n = ids.shape[1]
    f = n - tail
    ad = adapter_for(model)
    late_recurrent = [l for l in ad.recurrent_layers if l > split]
    ref = reference(model, ids)
    h = ref.hidden_states[split + 1][:, :f]  # h_S of the filled rows (the split's output)
    with watched(model) as seen:
        res = prefill_instrumented(model, ids, maps, tail=tail, mode=mode, split=split, logits="exact", select=None)
    assert sorted(seen["advance"]) == (late_recurrent if f else [])
    assert sorted(seen["layer"]) == list(ad.recurrent_layers)
    for l in late_recurrent:
        x_exact, out_exact = seen["layer"][l]
        assert x_exact.shape[1] == tail
        x_hat = h.new_zeros(h.shape[0], 0, HIDDEN)
        if f:
            x_hat, conv, rec = seen["advance"][l]
            want = h if maps is None else predict_inputs(h, *maps.layer(l))
            torch.testing.assert_close(x_hat, want, rtol=0, atol=ATOL)
        after, final, outs = recurrence(model, l, x_hat, x_exact)
        if f:
            assert rec.abs().max() > 1e-3  # the filled rows left a state worth comparing
            torch.testing.assert_close(conv, after[0], rtol=0, atol=ATOL)
            torch.testing.assert_close(rec, after[1], rtol=1e-4, atol=ATOL)
        entry = res.cache.layers[l]
        torch.testing.assert_close(entry.conv_states[0], final[0], rtol=0, atol=ATOL)
        torch.testing.assert_close(entry.recurrent_states[0], final[1], rtol=1e-4, atol=ATOL)
        torch.testing.assert_close(out_exact, outs, rtol=1e-4, atol=ATOL)
    # lower recurrent layers ran every row exactly: their final state is the transformers forward's
    for l in ad.recurrent_layers:
        if l <= split:
            torch.testing.assert_close(res.cache.layers[l].recurrent_states[0],
                                       ref.cache.layers[l].recurrent_states[0], rtol=1e-4, atol=ATOL)
    tally.example()


@settings(max_examples=EXAMPLES)
@given(hybrid_prompts(), st.data())
def test_exact_rows_are_causal(drawn, data):
    model, ids, split, tail, mode, maps = drawn
    n = ids.shape[1]
    f = n - tail
    t = data.draw(st.integers(0, n - 2), label="t")
    shift = torch.tensor(data.draw(st.lists(st.integers(1, VOCAB - 4), min_size=n - t - 1, max_size=n - t - 1),
                                   label="token changes"))
    changed = ids.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] - 3 + shift) % (VOCAB - 3) + 3
    assert (changed[:, t + 1:] != ids[:, t + 1:]).all()
    ad = adapter_for(model)
    with watched(model) as a_seen:
        a = prefill_instrumented(model, ids, maps, tail=tail, mode=mode, split=split, logits="exact", select=None)
    with watched(model) as b_seen:
        b = prefill_instrumented(model, changed, maps, tail=tail, mode=mode, split=split, logits="exact", select=None)
    early = a.exact_positions <= t
    # not bitwise: Qwen3-Next's MoE groups tokens by expert, so a changed route changes matmul shapes
    torch.testing.assert_close(a.logits[:, early], b.logits[:, early], rtol=0, atol=1e-5)
    assert not torch.allclose(a.logits[:, -1], b.logits[:, -1], rtol=0, atol=1e-5)  # the change arrives
    for l in range(model.config.num_hidden_layers):
        if ad.is_recurrent(l):
            continue
        for x, y in ((a.cache.layers[l].keys, b.cache.layers[l].keys),
                     (a.cache.layers[l].values, b.cache.layers[l].values)):
            torch.testing.assert_close(x[:, :, :t + 1], y[:, :, :t + 1], rtol=0, atol=1e-5)
    if 0 < f <= t + 1:  # every filled row precedes the change: the state the exact rows start from is the same
        for l, (x, conv, rec) in a_seen["advance"].items():
            _, conv_b, rec_b = b_seen["advance"][l]
            torch.testing.assert_close(conv, conv_b, rtol=0, atol=1e-5)
            torch.testing.assert_close(rec, rec_b, rtol=0, atol=1e-5)
    tally.example()
