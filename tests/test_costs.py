"""The cost model (ridgefill.costs) and the bench command (ridgefill.bench), without timed assertions."""

import dataclasses
import json
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig

from ridgefill import InputError, prefill
from ridgefill.bench import PRESETS, BenchConfig, bench, format_table, random_model, timing_maps
from ridgefill.cli import main
from ridgefill.costs import ModelShape, exact_cost, fill_cost, ideal_ratio
from ridgefill.select import DEFAULT_SELECT
from conftest import tiny_llama

SMALL = ModelShape(layers=4, hidden=8, heads=4, kv_heads=2, head_dim=2, intermediate=16, vocab=11)


def brute_force(shape: ModelShape, n: int, split: int | None, tail: int) -> int:
    """FLOPs counted row by row and layer by layer, straight from the definitions."""
    d, H, Hk, h, I, V = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, shape.vocab
    total = 2 * d * V  # LM head, last row
    for layer in range(shape.layers):
        for p in range(n):
            full = split is None or layer <= split or p >= n - tail
            if full:
                total += 2 * d * H * h + 2 * 2 * d * Hk * h + 2 * H * h * d  # q, k, v, o
                total += 2 * 3 * d * I  # gate, up, down
                total += 2 * 2 * H * h * (p + 1)  # q·kᵀ and p·v over keys 0..p
            else:
                total += 2 * d * d + d  # map
                total += 2 * 2 * d * Hk * h  # k, v
    return total


@pytest.mark.parametrize("n,split,tail", [(1, 0, 1), (7, 0, 3), (16, 1, 1), (16, 2, 16), (33, 2, 5)])
def test_closed_form_equals_brute_force(n, split, tail):
    assert exact_cost(SMALL, n).flops == brute_force(SMALL, n, None, n)
    assert fill_cost(SMALL, n, split, tail).flops == brute_force(SMALL, n, split, tail)


def brute_force_selected(shape: ModelShape, n: int, split: int, tail: int, chosen: list[int], rounds: int,
                         kv_maps: bool = False, queries: int = 1) -> int:
    """Two-pass selection counted pass by pass: pass 1 fills every filled row and runs the tail; each
    round scores with the last ``queries`` rows (each one more attention row over all ``n`` keys) and
    reruns the tail and the chosen rows."""
    d, H, Hk, h, I, V = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, shape.vocab
    full_row = lambda p: 2 * d * H * h + 2 * 2 * d * Hk * h + 2 * H * h * d + 2 * 3 * d * I + 4 * H * h * (p + 1)
    total = 2 * d * V
    for layer in range(shape.layers):
        if layer <= split:
            total += sum(full_row(p) for p in range(n))
            continue
        for p in range(n - tail):  # pass 1: every filled row's map and K/V
            total += (2 * d * 2 * Hk * h + 2 * Hk * h) if kv_maps else (2 * d * d + d + 2 * 2 * d * Hk * h)
        total += sum(full_row(p) for p in range(n - tail, n))
        for _ in range(rounds):
            total += queries * 4 * H * h * n  # the scores: each query row's attention, counted over n keys
            total += sum(full_row(p) for p in sorted(chosen) + list(range(n - tail, n)))
    return total


@pytest.mark.parametrize("chosen,rounds,kv_maps,queries", [([0, 3, 4, 9], 1, False, 1), ([1, 2], 2, False, 1),
                                                            ([5], 1, True, 1), ([0, 7, 8], 1, False, 4)])
def test_selection_cost_equals_brute_force(chosen, rounds, kv_maps, queries):
    n, split, tail = 20, 1, 6
    got = fill_cost(SMALL, n, split, tail, selected=chosen, rounds=rounds, kv_maps=kv_maps, queries=queries).flops
    assert got == brute_force_selected(SMALL, n, split, tail, chosen, rounds, kv_maps, queries)
    # more query rows than exact rows: at most the exact rows (tail and chosen) score (an upper bound)
    assert fill_cost(SMALL, n, split, tail, selected=chosen, rounds=rounds, queries=99).flops == \
        brute_force_selected(SMALL, n, split, tail, chosen, rounds, queries=tail + len(chosen))
    assert ideal_ratio(SMALL, n, split, tail, selected=chosen) < ideal_ratio(SMALL, n, split, tail)
    with pytest.raises(InputError, match="filled rows"):
        fill_cost(SMALL, n, split, tail, selected=[n - 1])


def test_rows_chosen_up_front_cost_one_pass():
    """``rounds=0`` (query-agnostic selection by leverage): one pass with the tail and the chosen rows
    exact, counted row by row, plus the leverage scores."""
    n, split, tail, chosen = 20, 1, 6, [0, 3, 4, 9]
    d, H, Hk, h, I, V = SMALL.hidden, SMALL.heads, SMALL.kv_heads, SMALL.head_dim, SMALL.intermediate, SMALL.vocab
    total = 2 * d * V + 2 * d ** 3 // 3 + n * (2 * d * d + 2 * d)
    for layer in range(SMALL.layers):
        for p in range(n):
            if layer <= split or p >= n - tail or p in chosen:
                total += 2 * d * H * h + 2 * 2 * d * Hk * h + 2 * H * h * d + 2 * 3 * d * I + 4 * H * h * (p + 1)
            else:
                total += 2 * d * d + d + 2 * 2 * d * Hk * h
    assert fill_cost(SMALL, n, split, tail, selected=chosen, rounds=0).flops == total
    assert fill_cost(SMALL, n, split, tail, selected=[], rounds=0).flops == fill_cost(SMALL, n, split, tail).flops
    with pytest.raises(InputError, match="rounds"):
        fill_cost(SMALL, n, split, tail, selected=chosen, rounds=-1)


def test_tail_covering_the_prompt_costs_what_exact_costs():
    for n in (1, 10, 100):
        assert fill_cost(SMALL, n, 1, n).flops == exact_cost(SMALL, n).flops
        assert ideal_ratio(SMALL, n, 1, n) == 1.0


def test_identity_fill_has_no_map_cost():
    ridge, ident = fill_cost(SMALL, 40, 1, 4), fill_cost(SMALL, 40, 1, 4, maps=False)
    assert ident.parts["maps"] == 0
    assert ridge.flops - ident.flops == (SMALL.layers - 2) * 36 * (2 * 8 * 8 + 8)
    assert ridge.weight_bytes - ident.weight_bytes == (SMALL.layers - 2) * (8 * 8 + 8) * 2


def test_ratio_grows_with_length_towards_layers_over_lower_layers():
    cfg = LlamaConfig(**PRESETS["llama3-8b-random"])
    ratios = [ideal_ratio(cfg, n, 16, 2048) for n in (8192, 32768, 131072, 2 ** 22)]
    assert ratios == sorted(ratios)
    assert 1.0 < ratios[0] and ratios[-1] < 32 / 17  # attention dominates: bound L / (S + 1)
    assert ratios[-1] > 0.97 * 32 / 17


def test_llama3_8b_shape_parameter_count():
    """The weights the cost model reads are Llama-3.1-8B's 8.03 B parameters (bf16: 2 bytes each)."""
    shape = ModelShape.from_config(LlamaConfig(**PRESETS["llama3-8b-random"]))
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) == (32, 4096, 32, 8, 128)
    params = exact_cost(shape, 1).weight_bytes / 2 - 4096  # minus the one embedding row gathered
    assert params + 128256 * 4096 == pytest.approx(8.03e9, rel=0.002)  # + the (untied) embedding table
    # the KV cache of 128K tokens in bf16: 32 layers x 2 x 8 heads x 128 x 2 bytes per token = 16 GiB
    assert exact_cost(shape, 131072).kv_cache_bytes == 16 * 2 ** 30


@pytest.mark.parametrize("mode", ["exact", "ridge", "identity"])
def test_cost_model_counts_the_matmuls_the_code_runs(mode):
    """torch's FLOP counter over a real prefill (matmuls only; it does not count CPU attention)
    agrees with the model's projections + MLP + maps + LM head: filled rows run no MLP, no Q/O
    projection, and the LM head runs on the last row only."""
    model = tiny_llama(seed=0)
    n, split, tail = 48, 2, 8
    ids = torch.randint(0, 101, (1, n), generator=torch.Generator().manual_seed(0))
    maps = timing_maps(model, split) if mode == "ridge" else None
    with FlopCounterMode(display=False) as counter:
        prefill(model, ids, maps, tail=tail, mode=mode, split=split, select=None)
    counted = sum(counter.get_flop_counts()["Global"].values())
    shape = ModelShape.from_config(model.config)
    cost = exact_cost(shape, n) if mode == "exact" else fill_cost(shape, n, split, tail, maps=mode == "ridge")
    bias_adds = (shape.layers - split - 1) * (n - tail) * shape.hidden if mode == "ridge" else 0
    assert counted == cost.flops - cost.parts["attention"] - bias_adds


def test_from_config_reads_smollm2_shape():
    shape = ModelShape.from_config(LlamaConfig(**PRESETS["smollm2-random"]))
    assert shape == ModelShape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
    # S=15, tail 256 at 4K tokens: the ratio the CPU bench compares against
    assert 1.6 < ideal_ratio(shape, 4096, 15, 256) < 1.65


def test_bad_sizes_raise_input_error():
    with pytest.raises(InputError, match="split"):
        fill_cost(SMALL, 10, 3, 2)
    with pytest.raises(InputError, match="split"):
        fill_cost(SMALL, 10, -1, 2)
    with pytest.raises(InputError, match="tail"):
        fill_cost(SMALL, 10, 1, 11)
    with pytest.raises(InputError, match="tail"):
        fill_cost(SMALL, 10, 1, 0)
    with pytest.raises(InputError, match="prompt length"):
        exact_cost(SMALL, 0)
    with pytest.raises(InputError, match="bytes_per_value"):
        exact_cost(SMALL, 4, bytes_per_value=0)
    with pytest.raises(InputError, match="kv_heads"):
        ModelShape(layers=2, hidden=8, heads=3, kv_heads=2, head_dim=2, intermediate=4, vocab=5)
    with pytest.raises(InputError, match="positive integer"):
        ModelShape(layers=0, hidden=8, heads=2, kv_heads=2, head_dim=2, intermediate=4, vocab=5)

    class NoVocab:
        num_hidden_layers, hidden_size, num_attention_heads, intermediate_size = 2, 8, 2, 4

    with pytest.raises(InputError, match="vocab_size"):
        ModelShape.from_config(NoVocab())


# --- the bench -------------------------------------------------------------------------------------

def test_random_model_has_the_preset_shape_dtype_and_device():
    model = random_model("tiny-random", "cpu", torch.bfloat16)
    assert model.config.hidden_size == PRESETS["tiny-random"]["hidden_size"]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not model.training
    with pytest.raises(InputError, match="unknown random model"):
        random_model("llama-9000")


def test_timing_maps_shape_and_dtype():
    model = random_model("tiny-random", "cpu", torch.bfloat16)
    maps = timing_maps(model, 2)
    assert maps.weights.shape == (3, 64, 64) and maps.weights.dtype == torch.bfloat16
    assert (maps.weights.float() - torch.eye(64)).abs().max() < 0.1  # near the identity: activations stay sane
    maps.check_model(model, 2)
    with pytest.raises(InputError, match="split"):
        timing_maps(model, 5)


def test_bench_report(tmp_path):
    out = tmp_path / "bench.json"
    cfg = BenchConfig(model="tiny-random", lengths=(64, 96), split=2, tail=16, repeats=2, warmup=1,
                      calibration=True, calib_lengths=(64, 128), calib_chunk=32, json=str(out))
    report = bench(cfg, progress=False)
    assert report["context"] == BenchConfig.context == 1  # context maps, the default
    assert json.loads(out.read_text())["rows"][0]["n"] == 64
    assert [r["n"] for r in report["rows"]] == [64, 96]
    for r in report["rows"]:
        assert r["ideal"] == pytest.approx(ideal_ratio(LlamaConfig(**PRESETS["tiny-random"]), r["n"], 2, 16, context=1))
        assert len(r["ratios"]) == 2 and r["ratio"] > 0
        assert r["measured_over_ideal"] == pytest.approx(r["ratio"] / r["ideal"])
        assert set(r["map_step"]) == {"map_step_s"} and r["map_step"]["map_step_s"] > 0
        sel = r["selects"]["auto"]  # the default: 'on' for the bench's random maps
        assert sel["rows"] > 0 and sel["ideal"] < r["ideal"] and sel["peak_bytes"] is not None
    assert report["selects"] == {"auto": str(DEFAULT_SELECT)}
    assert report["fast_path_check"]["ok"]
    assert [c["tokens"] for c in report["calibration"]] == [64, 128]
    table = format_table(report)
    assert "meas/ideal" in table and "calib tok/s" in table and "ok" in table and "map+K/V step" in table
    assert "with row selection auto" in table and "/ exact" in table


def test_bench_with_row_selection(capsys):
    from ridgefill.select import Select

    cfg = BenchConfig(model="tiny-random", lengths=(96,), split=2, tail=16, repeats=2, warmup=0,
                      selects=(Select(budget=8, before=1, after=2), "one-pass"))
    report = bench(cfg, progress=False)
    r = report["rows"][0]
    two, one = r["selects"][str(Select(budget=8, before=1, after=2))], r["selects"]["one-pass"]
    assert two["rows"] == 8 and len(two["s_all"]) == 2
    assert two["ideal"] < r["ideal"]  # the chosen rows and the second pass cost FLOPs
    assert two["measured_over_ideal"] == pytest.approx(two["ratio"] / two["ideal"])
    assert 0 < one["rows"] and one["ideal"] < r["ideal"]
    assert main(["bench", "--model", "tiny-random", "--lengths", "64", "--split", "1", "--tail", "8", "--repeats",
                 "1", "--select", "on,budget=0.1", "--select", "one-pass"]) == 0
    printed = capsys.readouterr()
    assert "with row selection on,budget=0.1" in printed.out and "with row selection one-pass" in printed.out
    # one progress line per timed round, with every prefill's seconds (a long length shows where it is)
    assert re.search(r"N=64 round 1/1: exact \d+\.\d\d s, fill \d+\.\d\d s, sel:on,budget=0.1 \d+\.\d\d s, "
                     r"sel:one-pass \d+\.\d\d s", printed.err), printed.err
    assert re.search(r"N=64 peak memory \(untimed\): exact (\d+|\?) MiB, fill (\d+|\?) MiB, sel:on,budget=0.1 (\d+|\?) MiB",
                     printed.err), printed.err
    # query-agnostic selection: one pass, its bound counts the chosen rows once (rounds=0)
    cfg = BenchConfig(model="tiny-random", lengths=(96,), split=2, tail=16, repeats=1, warmup=0,
                      selects=(Select.parse("prompt,budget=8"),))
    r = bench(cfg, progress=False)["rows"][0]
    sel = next(iter(r["selects"].values()))
    assert sel["rows"] == 8 and sel["ideal"] < r["ideal"]


def test_bench_command_line(capsys):
    code = main(["bench", "--model", "tiny-random", "--lengths", "48", "--split", "1", "--tail", "8",
                 "--repeats", "1", "--select", "off"])
    out = capsys.readouterr().out
    assert code == 0
    assert "ideal" in out and "     48" in out


@pytest.mark.parametrize("args,message", [
    (["--tail", "64", "--lengths", "64"], "tail"),
    (["--split", "9"], "split"),
    (["--lengths", "8k"], "context"),
    (["--repeats", "0"], "repeats"),
    (["--select", "budget=4"], "use one of auto, on, two-pass, one-pass, prompt, off"),
])
def test_bench_bad_input_is_a_clear_error(capsys, args, message):
    base = ["bench", "--model", "tiny-random", "--lengths", "32", "--tail", "4", "--split", "1", "--repeats", "1"]
    code = main(base + args)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error:") and message in err


def test_recorded_command_names_the_json_file_only():
    """The command a bench result records carries no folder of the machine that ran it."""
    from ridgefill.cli import recorded_command

    assert recorded_command(["bench", "--lengths", "8k", "--json", "/some/where/out/bench.json"]) == \
        "ridgefill bench --lengths 8k --json bench.json"
    assert recorded_command(["bench", "--json=/abs/r.json", "--split", "16"]) == "ridgefill bench --json=r.json --split 16"
HYBRID = dataclasses.replace(SMALL, linear_layers=(0, 2), linear_key_heads=1, linear_value_heads=2, linear_key_dim=3,
                             linear_value_dim=4, linear_conv=4, attn_output_gate=True)


def brute_force_hybrid(shape: ModelShape, n: int, split: int | None, tail: int) -> int:
    """FLOPs of a hybrid model row by row: linear-attention layers (input projections, convolution and delta rule for
    every row; output projection and MLP for rows run in full), gated attention layers as in ``brute_force``."""
    d, H, Hk, h, I, V = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, shape.vocab
    K, Vd, hv = shape.linear_key_heads * shape.linear_key_dim, shape.linear_value_heads * shape.linear_value_dim, \
        shape.linear_value_heads
    total = 2 * d * V
    for layer in range(shape.layers):
        for p in range(n):
            full = split is None or layer <= split or p >= n - tail
            if layer in shape.linear_layers:
                total += 2 * d * (2 * K + 2 * Vd + 2 * hv) + 2 * shape.linear_conv * (2 * K + Vd)
                total += 6 * hv * shape.linear_key_dim * shape.linear_value_dim
                if full:
                    total += 2 * Vd * d + 2 * 3 * d * I
                else:
                    total += 2 * d * d + d  # map
            elif full:
                total += 2 * d * 2 * H * h + 2 * 2 * d * Hk * h + 2 * H * h * d  # q and gate, k, v, o
                total += 2 * 3 * d * I + 2 * 2 * H * h * (p + 1)
            else:
                total += 2 * d * d + d + 2 * 2 * d * Hk * h  # map, k, v
    return total


@pytest.mark.parametrize("n,split,tail", [(1, 0, 1), (7, 0, 3), (16, 1, 1), (16, 2, 16), (33, 1, 5)])
def test_hybrid_closed_form_equals_brute_force(n, split, tail):
    """Linear-attention layers: filled rows pay the map, input projections, convolution and recurrence; no K/V, no
    attention over keys, no KV cache."""
    assert exact_cost(HYBRID, n).flops == brute_force_hybrid(HYBRID, n, None, n)
    assert fill_cost(HYBRID, n, split, tail).flops == brute_force_hybrid(HYBRID, n, split, tail)
    assert exact_cost(HYBRID, n).kv_cache_bytes == 2 * 2 * n * HYBRID.kv_heads * HYBRID.head_dim * 2  # 2 attention layers
    with pytest.raises(InputError, match="linear-attention"):
        fill_cost(HYBRID, 16, 1, 4, selected=[0])


def test_from_config_reads_a_hybrid_shape():
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(num_hidden_layers=8, layer_types=["linear_attention"] * 3 + ["full_attention"] + [
        "linear_attention"] * 3 + ["full_attention"])
    shape = ModelShape.from_config(cfg)
    assert shape.linear_layers == (0, 1, 2, 4, 5, 6) and shape.attn_output_gate
    assert (shape.linear_key_heads, shape.linear_value_heads, shape.linear_key_dim, shape.linear_conv) == (
        cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_conv_kernel_dim)
    assert ideal_ratio(shape, 8192, 3, 256) > 1.0
