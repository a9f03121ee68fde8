"""Host synchronisations of a prefill: a constant number, whatever the prompt length and the number of late layers.

On a GPU every operation whose result the host reads waits for the device; a prefill that reads the device
per row or per layer loses its speed to those waits. The plan of a prefill is decided on the host, so it
reads the device a fixed number of times: the prompt once, the scores of each selection round once, the
finiteness checks once. :class:`ridgefill.syncs.HostSyncCounter` counts those reads on the CPU (the same
operations that would wait on a GPU).
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ridgefill import prefill
from ridgefill.bench import timing_maps
from ridgefill.syncs import HostSyncCounter

#: The bound the selection-speed issue sets: at most 24 per prefill.
BOUND = 24


def _model(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=211, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      rope_theta=10000.0, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def models():
    from ridgefill.adapters import adapter_for
    from ridgefill.select import induction_scores

    out = {layers: _model(layers) for layers in (8, 30)}
    for model in out.values():  # once per model (maps from `ridgefill calibrate` store them): not a prefill's work
        induction_scores(adapter_for(model))
    return out


def _count(model, n: int, **kwargs) -> dict:
    ids = torch.randint(0, 211, (1, n), generator=torch.Generator().manual_seed(n))
    ids[0, -40:-30] = ids[0, 100:110]  # the question quotes the prompt: the lexical part finds rows
    with HostSyncCounter() as syncs:
        res = prefill(model, ids, kwargs.pop("maps", None), **kwargs)
    assert kwargs.get("select") in (None, "off") or kwargs.get("mode") == "exact" or res.selected.numel() > 0
    return dict(syncs.counts)


@pytest.mark.parametrize("select", ["off", "two-pass", "one-pass", "prompt"])
def test_a_prefill_reads_the_device_a_constant_number_of_times(models, select):
    """The count is the same at 2,048 and 8,000 rows and with 7 or 29 late layers, and at most 24."""
    counts = {}
    for layers, model in models.items():
        maps = timing_maps(model, 1, context=1)
        for n in (2048, 8000):
            counts[layers, n] = _count(model, n, maps=maps, tail=256, select=select)
    first = next(iter(counts.values()))
    assert all(c == first for c in counts.values()), counts
    assert sum(first.values()) <= BOUND, first
    # the figures the docs give (docs/bench.md, "Host synchronisations"): the prompt and the finiteness
    # flags, plus one read of the scores for each selection that scores on the device
    assert sum(first.values()) == {"off": 2, "two-pass": 3, "one-pass": 3, "prompt": 3}[select], first


def test_the_exact_and_baseline_modes_read_the_device_a_constant_number_of_times(models):
    model = models[8]
    for kwargs in (dict(mode="exact"), dict(mode="identity", split=1, select="off"),
                   dict(mode="none", split=1, select="off")):
        a, b = (_count(model, n, tail=256, **dict(kwargs)) for n in (2048, 8000))
        assert a == b and sum(a.values()) <= 3, (kwargs, a)
