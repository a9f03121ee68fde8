"""Unit tests of the plugin's pieces that need no engine: the row plan, the maps reader, the settings
and the engine checks."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from ridgefill_vllm.errors import InputError, MapsFormatError, MapsMismatchError
from ridgefill_vllm.llama import DEFAULT_TAIL, check_engine, fill_settings
from ridgefill_vllm.maps import load_fill_maps
from ridgefill_vllm.plan import make_plan


def test_plan_tail_per_request_and_decode_tokens_exact():
    # three requests: a 6-token prompt, a decoding step, a 2-token prompt; tail 3
    qsl = torch.tensor([0, 6, 7, 9], dtype=torch.int32)
    slots = torch.arange(100, 109)
    plan = make_plan(qsl, slots, tail=3)
    assert plan.filled.tolist() == [0, 1, 2]
    assert plan.exact.tolist() == [3, 4, 5, 6, 7, 8]
    assert plan.filled_slots.tolist() == [100, 101, 102]
    assert plan.exact_slots.tolist() == [103, 104, 105, 106, 107, 108]
    assert plan.num_tokens == 9


def test_plan_previous_token_stays_in_its_request():
    """Context maps read the previous token's h_S: within the request, -1 (zeros) at a request's first token."""
    qsl = torch.tensor([0, 6, 7, 12], dtype=torch.int32)  # a 6-token prompt, a decoding step, a 5-token prompt
    plan = make_plan(qsl, torch.arange(100, 112), tail=2)
    assert plan.filled.tolist() == [0, 1, 2, 3, 7, 8, 9]
    assert plan.filled_prev.tolist() == [-1, 0, 1, 2, -1, 7, 8]


def test_plan_none_without_filled_tokens():
    assert make_plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.arange(2), tail=1) is None
    assert make_plan(torch.tensor([0, 4], dtype=torch.int32), torch.arange(4), tail=4) is None


def test_plan_ignores_padding_tokens():
    plan = make_plan(torch.tensor([0, 5], dtype=torch.int32), torch.arange(8), tail=2)
    assert plan.filled.tolist() == [0, 1, 2] and plan.exact.tolist() == [3, 4]


def test_maps_reader_context_maps(tmp_path):
    """Context maps ([2d, d] weights, metadata context 1) are read; a context that does not fit the weights is
    refused."""
    d, layers = 4, 2
    w = torch.zeros(layers, 2 * d, d)
    meta = {"format_version": 1, "split": 1, "lambdas": [1.0] * layers, "context": 1}
    save_file({"weights": w, "biases": torch.zeros(layers, d)}, tmp_path / "ctx.safetensors",
              metadata={"ridgefill": json.dumps(meta)})
    maps = load_fill_maps(tmp_path / "ctx.safetensors")
    assert maps.context == 1
    maps.check_shape(4, d)
    with pytest.raises(MapsMismatchError, match="needs"):
        maps.check_shape(4, 2 * d)
    save_file({"weights": w, "biases": torch.zeros(layers, d)}, tmp_path / "lying.safetensors",
              metadata={"ridgefill": json.dumps(dict(meta, context=0))})
    with pytest.raises(MapsFormatError, match="inconsistent shapes"):
        load_fill_maps(tmp_path / "lying.safetensors")


def _maps_file(path, split=1, layers=2, d=4, meta=None, **tensors):
    t = {"weights": torch.eye(d).expand(layers, d, d).contiguous(), "biases": torch.zeros(layers, d)}
    t.update(tensors)
    m = {"format_version": 1, "split": split, "lambdas": [1.0] * layers}
    m.update(meta or {})
    save_file(t, str(path), metadata={"ridgefill": json.dumps(m)})
    return path


def test_maps_reader_reads_and_checks_shapes(tmp_path):
    maps = load_fill_maps(_maps_file(tmp_path / "m.safetensors"))
    assert maps.split == 1 and maps.weights.shape == (2, 4, 4)
    maps.check_shape(num_layers=4, hidden=4)
    with pytest.raises(MapsMismatchError, match="needs"):
        maps.check_shape(num_layers=5, hidden=4)
    with pytest.raises(MapsMismatchError, match="hidden size 8"):
        maps.check_shape(num_layers=4, hidden=8)


def test_maps_reader_refuses_bad_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_fill_maps(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(MapsFormatError, match="truncated or corrupted"):
        load_fill_maps(bad)
    with pytest.raises(MapsFormatError, match="format version"):
        load_fill_maps(_maps_file(tmp_path / "v.safetensors", meta={"format_version": 2}))
    with pytest.raises(MapsFormatError, match="kind 'kv'"):
        load_fill_maps(_maps_file(tmp_path / "kv.safetensors", meta={"kind": "kv"}))
    with pytest.raises(MapsFormatError, match="NaN or Inf"):
        load_fill_maps(_maps_file(tmp_path / "nan.safetensors", biases=torch.full((2, 4), float("nan"))))
    with pytest.raises(MapsFormatError, match="inconsistent shapes"):
        load_fill_maps(_maps_file(tmp_path / "s.safetensors", biases=torch.zeros(2, 3)))


def test_weight_sample_check(tmp_path):
    sample = [0.5, -1.25, 3.0, 0.0]
    maps = load_fill_maps(_maps_file(tmp_path / "m.safetensors", meta={"weight_sample": sample}))
    maps.check_weight_sample([3.0, 0.0, 0.5, -1.25], torch.float32)  # any order
    maps.check_weight_sample([3.0, 0.0, 0.5, -1.25 * (1 + 2 ** -9)], torch.bfloat16)  # bfloat16 rounding
    with pytest.raises(MapsMismatchError, match="other weights"):
        maps.check_weight_sample([3.0, 0.0, 0.5, -1.3], torch.float32)
    with pytest.raises(MapsMismatchError, match="4 sampled weight values"):
        maps.check_weight_sample([3.0, 0.0, 0.5], torch.float32)


def test_settings():
    assert fill_settings(SimpleNamespace()) is None
    assert fill_settings(SimpleNamespace(ridgefill={"maps": "m.safetensors"})) == ("m.safetensors", DEFAULT_TAIL)
    assert fill_settings(SimpleNamespace(ridgefill={"maps": "m.safetensors", "tail": 8})) == ("m.safetensors", 8)
    assert fill_settings(SimpleNamespace(ridgefill={"tail": 8})) is None  # no maps: the exact model
    for bad in ({"maps": "m", "tail": 0}, {"maps": "m", "tail": 2.0}, {"maps": "m", "tial": 3}, "m.safetensors"):
        with pytest.raises(InputError):
            fill_settings(SimpleNamespace(ridgefill=bad))


def _engine(**changes):
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(enable_chunked_prefill=False),
        cache_config=SimpleNamespace(enable_prefix_caching=False),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1),
        speculative_config=None, quant_config=None,
        model_config=SimpleNamespace(hf_config=SimpleNamespace()))
    for path, value in changes.items():
        obj, attr = cfg, path.split("__")
        for a in attr[:-1]:
            obj = getattr(obj, a)
        setattr(obj, attr[-1], value)
    return cfg


def test_engine_checks():
    check_engine(_engine())
    for change, words in [({"scheduler_config__enable_chunked_prefill": True}, "no-enable-chunked-prefill"),
                          ({"cache_config__enable_prefix_caching": True}, "no-enable-prefix-caching"),
                          ({"speculative_config": object()}, "speculative"),
                          ({"parallel_config__pipeline_parallel_size": 2}, "pipeline"),
                          ({"quant_config": object()}, "quantized")]:
        with pytest.raises(InputError, match=words):
            check_engine(_engine(**change))
