"""The context-maps experiment (``scripts/context_maps.py``, docs/evaluate.md "Thirteenth and fourteenth
sessions"): its features are the split states of the row and of the rows before it (zeros before row 0),
and its ``kv_hook`` writes the filled rows' K/V from a map over those features through the same path as the
prefill's own maps."""

import importlib.util
from pathlib import Path

import torch

from ridgefill import prefill
from conftest import oracle_maps, reference, tiny_llama

S = 2


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "context_maps.py"
    spec = importlib.util.spec_from_file_location("context_maps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _oracle_case():
    """The script, a tiny model, a prompt, oracle maps (they predict every late layer's input exactly on it), the
    exact forward, and the oracle maps placed in either block of ``h,prev`` / ``prev,h`` context features (the
    other block zero), with the same features' name; also the wrong placement (``[0; W]`` read as ``h,prev``)."""
    cm = _script()
    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    maps = oracle_maps(model, ids, S)
    zero = torch.zeros_like(maps.weights)
    placed = (("h,prev", torch.cat([maps.weights, zero], 1)), ("prev,h", torch.cat([zero, maps.weights], 1)))
    return cm, model, ids, maps, reference(model, ids), placed, torch.cat([zero, maps.weights], 1)


def test_features_are_the_row_and_the_rows_before_it():
    cm = _script()
    h = torch.arange(12.0).view(4, 3)
    f = cm.features(h, "h,prev,prev2")
    assert f.shape == (4, 9)
    torch.testing.assert_close(f[:, :3], h, rtol=0, atol=0)
    torch.testing.assert_close(f[:, 3:6], torch.cat([torch.zeros(1, 3), h[:3]]), rtol=0, atol=0)
    torch.testing.assert_close(f[:, 6:], torch.cat([torch.zeros(2, 3), h[:2]]), rtol=0, atol=0)
    g = cm.features(h + 100 * (torch.arange(4) >= 2)[:, None], "h,prev")  # rows 2, 3 changed
    torch.testing.assert_close(g[:2], cm.features(h, "h,prev")[:2], rtol=0, atol=0)  # causal


def test_hook_writes_the_context_maps_prediction_and_keeps_row_0():
    cm, model, ids, maps, out, placed, wrong = _oracle_case()
    rows = torch.arange(54)
    heads, dim = out.cache.layers[0].keys.shape[1], out.cache.layers[0].keys.shape[3]
    given = torch.randn(1, heads, 54, dim), torch.randn(1, heads, 54, dim)  # what the prefill would write
    for name, w in placed:
        hook = cm.make_hook(model, ids, {"W": w, "b": maps.biases}, S, "inputs", name)
        for layer in range(S + 1, model.config.num_hidden_layers):
            k, v = hook(layer, *given, rows)
            exact = out.cache.layers[layer]
            torch.testing.assert_close(k[:, :, 1:], exact.keys[:, :, 1:54], rtol=0, atol=5e-4)
            torch.testing.assert_close(v[:, :, 1:], exact.values[:, :, 1:54], rtol=0, atol=5e-4)
            torch.testing.assert_close(k[:, :, 0], given[0][:, :, 0], rtol=0, atol=0)  # row 0: the prefill's own
            torch.testing.assert_close(v[:, :, 0], given[1][:, :, 0], rtol=0, atol=0)
    # a map that reads the wrong block does not give the exact K/V: the test can fail
    hook = cm.make_hook(model, ids, {"W": wrong, "b": maps.biases}, S, "inputs", "h,prev")
    k, _ = hook(S + 1, *given, rows)
    assert (k[:, :, 1:] - out.cache.layers[S + 1].keys[:, :, 1:54]).abs().max() > 1e-2


def test_hook_with_the_context_block_zero_equals_the_prefills_own_maps():
    cm, model, ids, maps, out, placed, wrong = _oracle_case()
    for name, w in placed:
        hook = cm.make_hook(model, ids, {"W": w, "b": maps.biases}, S, "inputs", name)
        res = prefill(model, ids, maps, tail=6, mode="ridge", logits="exact", kv_hook=hook)
        for layer in range(model.config.num_hidden_layers):
            torch.testing.assert_close(res.cache.layers[layer].keys, out.cache.layers[layer].keys, rtol=0, atol=5e-4)
            torch.testing.assert_close(res.cache.layers[layer].values, out.cache.layers[layer].values, rtol=0, atol=5e-4)
    # a map that reads the wrong block is not the exact fill: the test can fail
    hook = cm.make_hook(model, ids, {"W": wrong, "b": maps.biases}, S, "inputs", "h,prev")
    res = prefill(model, ids, maps, tail=6, mode="ridge", logits="exact", kv_hook=hook)
    assert (res.cache.layers[S + 1].keys - out.cache.layers[S + 1].keys).abs().max() > 1e-2
