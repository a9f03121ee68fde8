"""Fault suite: bad inputs at every public entry point give the project's typed errors (one regression
test per reported case), an interrupted calibration resumes to bit-identical maps, concurrent saves
never leave a mixed maps/statistics pair, and fuzzed maps, statistics and GGUF files give a clean
typed error or a correct load, never another exception.

The fuzz tests use fixed seeds and print how many inputs they tried (``pytest -s`` shows it).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import tiny_llama
from gguf_helpers import metadata_end, write_tiny_gguf
from ridgefill import RidgeMaps, load_maps, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.data.models import check_gguf, load_model
from ridgefill.calibration import calibrate
from ridgefill.checkpoint import checkpoint_path, load_checkpoint
from ridgefill.errors import (AssetError, InputError, MapsFormatError, MapsMismatchError, NonFiniteError,
                              SingularGramError)
from ridgefill.fill import generate_after
from ridgefill.maps import load_stats, maps_digest, stats_path
from ridgefill.ridge import RidgeStats, fit_maps, solve_ridge


@pytest.fixture(autouse=True, scope="module")
def _own_model_cache(tmp_path_factory):
    """The tiny GGUFs here are converted into cached copies (ridgefill.data.models.gguf_copy): keep those out
    of the user's cache. No test here uses the bundled model."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RIDGEFILL_CACHE", str(tmp_path_factory.mktemp("model-cache")))
    yield
    mp.undo()

REPO = Path(__file__).resolve().parent.parent
S = 2


class CharTokenizer:
    """One token per byte, modulo the vocabulary (tiny models need no real tokenizer)."""

    def __init__(self, vocab: int = 101):
        self.vocab = vocab

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [b % self.vocab for b in text.encode()]}


TEXT = "It was a bright cold day in April, and the clocks were striking thirteen. " * 40


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=7)


@pytest.fixture(scope="module")
def maps(model):
    return calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], split=S, tokens=1024, chunk=128,
                     lam="auto", model_name="tiny", progress=False, context=0)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    source = write_tiny_gguf(path)
    return path, source


# ------------------------------------------------------------------------------------------------
# Case 1: a GGUF (or a model directory) with a weight missing is refused, naming the weight
# ------------------------------------------------------------------------------------------------

def test_gguf_loads_exactly(gguf_file):
    path, source = gguf_file
    model, _, name = load_model(path)
    assert name == "tiny.gguf"
    for (n, p), (n2, p2) in zip(source.named_parameters(), model.named_parameters(), strict=True):
        assert n == n2 and torch.equal(p, p2), n


def test_gguf_missing_tensor_is_refused(tmp_path):
    path = tmp_path / "gap.gguf"
    write_tiny_gguf(path, drop=("blk.1.ffn_down.weight",))
    with pytest.raises(AssetError, match=r"1 expected weight\(s\) are missing from the GGUF file, e\.g\. "
                                         r"model\.layers\.1\.mlp\.down_proj\.weight"):
        load_model(path)


def test_directory_missing_weight_is_refused(tmp_path, gguf_file):
    path, _ = gguf_file
    _, tok, _ = load_model(path)
    out = tmp_path / "dir"
    tiny_llama(seed=3, vocab=64).save_pretrained(out)
    tok.save_pretrained(out)
    assert load_model(out)[2] == "dir"
    weights = out / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys() if k != "model.layers.0.self_attn.v_proj.weight"}
    save_file(kept, str(weights), metadata={"format": "pt"})
    with pytest.raises(AssetError, match=r"missing from the model's weight files, e\.g\. "
                                         r"model\.layers\.0\.self_attn\.v_proj\.weight"):
        load_model(out)


# ------------------------------------------------------------------------------------------------
# Case 2: a GGUF truncated in its key/value metadata gives AssetError, not struct.error
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["magic", "kv", "index", "data"])
def test_truncated_gguf(tmp_path, gguf_file, where):
    path, _ = gguf_file
    data = path.read_bytes()
    kv_end, data_start = metadata_end(path)
    cut = {"magic": 3, "kv": kv_end // 2, "index": (kv_end + data_start) // 2, "data": len(data) - 100}[where]
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    with pytest.raises(AssetError, match="is truncated") as e:
        load_model(bad)
    assert "cut.gguf" in str(e.value)


# ------------------------------------------------------------------------------------------------
# Case 3: generate_after refuses a used PrefillResult and other input_ids
# ------------------------------------------------------------------------------------------------

def test_prefill_result_knows_its_prompt(model, maps):
    ids = torch.randint(0, 101, (1, 16), generator=torch.Generator().manual_seed(3))
    res = prefill(model, ids, maps, tail=4, select=None)
    assert res.prompt_rows == 16 and len(res.prompt_sha256) == 64 and not res.consumed
    with pytest.raises(InputError, match="have 12 rows but the cache was prefilled from 16"):
        generate_after(model, ids[:, :12], res, 4)
    other = ids.clone()
    other[0, 5] = (other[0, 5] + 1) % 101
    with pytest.raises(InputError, match="not the tokens this cache was prefilled from"):
        generate_after(model, other, res, 4)
    assert not res.consumed  # refused calls leave the result usable
    new = generate_after(model, ids, res, 4)
    assert new.shape == (1, 4) and res.consumed
    with pytest.raises(InputError, match="already decoded from"):
        generate_after(model, ids, res, 4)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_generate_after_max_new_tokens(model, maps, bad):
    ids = torch.randint(0, 101, (1, 16))
    res = prefill(model, ids, maps, tail=4, select=None)
    with pytest.raises(InputError, match="max_new_tokens must be an integer ≥ 1"):
        generate_after(model, ids, res, bad)


# ------------------------------------------------------------------------------------------------
# Case 4: the weight check does not depend on the load dtype; a dtype difference is named
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_maps_accept_same_weights_in_another_dtype(gguf_file, dtype):
    path, _ = gguf_file
    f32, tok, _ = load_model(path)
    m = calibrate(f32, CharTokenizer(64), [TEXT], split=0, tokens=512, chunk=64, lam=1.0, progress=False, context=0)
    assert m.meta["weights_dtype"] == "float32" and m.meta["weights_device"] == "cpu"
    low, _, _ = load_model(path, dtype=dtype)
    m.check_model(low)  # no error: the same weights
    ids = torch.tensor([[1] + list(range(3, 30))])
    res = prefill(low, ids, m, tail=4, select=None)
    assert res.logits.dtype == dtype


def test_maps_refuse_other_weights_in_another_dtype(tmp_path, gguf_file):
    path, _ = gguf_file
    f32, _, _ = load_model(path)
    m = calibrate(f32, CharTokenizer(64), [TEXT], split=0, tokens=512, chunk=64, lam=1.0, progress=False, context=0)
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1)
    bf16, _, _ = load_model(other, dtype=torch.bfloat16)
    with pytest.raises(MapsMismatchError, match=r"with other weights: sampled values differ by up to .* "
                                                r"\(fitted in float32 on cpu, this model is bfloat16 on cpu"):
        m.check_model(bf16)


def test_old_maps_without_sample_name_the_dtype(gguf_file):
    path, _ = gguf_file
    f32, _, _ = load_model(path)
    m = calibrate(f32, CharTokenizer(64), [TEXT], split=0, tokens=512, chunk=64, lam=1.0, progress=False, context=0)
    for k in ("weight_sample", "weights_dtype", "weights_device"):
        del m.meta[k]  # as written before weight samples were stored
    m.check_model(f32)
    bf16, _, _ = load_model(path, dtype=torch.bfloat16)
    with pytest.raises(MapsMismatchError, match="weights in float32, and this model is loaded in bfloat16: "
                                                "the dtype differs"):
        m.check_model(bf16)


# ------------------------------------------------------------------------------------------------
# Case 5: load_maps validates the metadata's types
# ------------------------------------------------------------------------------------------------

def _rewrite(src: Path, dst: Path, meta=None, raw: str | None = None, tensors=None) -> Path:
    with safe_open(str(src), framework="pt") as f:
        old = json.loads(f.metadata()["ridgefill"])
        ts = {k: f.get_tensor(k) for k in f.keys()}
    ts = tensors(ts) if tensors else ts
    text = raw if raw is not None else json.dumps(meta(old) if meta else old)
    save_file(ts, str(dst), metadata={"ridgefill": text})
    return dst


def _set(key, value):
    return lambda m: {**m, key: value}


@pytest.mark.parametrize("edit, message", [
    (dict(raw="[1, 2, 3]"), "is a JSON list, not an object"),
    (dict(raw='"maps"'), "is a JSON str, not an object"),
    (dict(raw="{not json"), "is not valid JSON"),
    (dict(meta=lambda m: {**m, "lambdas": ["a"] * len(m["lambdas"])}), "bad metadata: lambdas=\\['a'"),
    (dict(meta=lambda m: {**m, "lambdas": [None] * len(m["lambdas"])}), "bad metadata: lambdas=\\[None"),
    (dict(meta=lambda m: {**m, "lambdas": [-1.0] * len(m["lambdas"])}), "bad metadata: lambdas=\\[-1.0"),
    (dict(meta=lambda m: {**m, "lambdas": [float("nan")] * len(m["lambdas"])}), "bad metadata: lambdas=\\[nan"),
    (dict(meta=lambda m: {**m, "lambdas": 1.0}), "bad metadata: lambdas=1.0"),
    (dict(meta=_set("split", True)), "bad metadata: split=True"),
    (dict(meta=_set("split", 2.0)), "bad metadata: split=2.0"),
    (dict(meta=_set("split", -1)), "bad metadata: split=-1"),
    (dict(meta=lambda m: {k: v for k, v in m.items() if k != "split"}), "bad metadata: split missing"),
    (dict(meta=_set("format_version", True)), "format version True"),
    (dict(meta=_set("calibration_tokens", "many")), "bad metadata: calibration_tokens='many'"),
    (dict(meta=_set("model_hash", 7)), "bad metadata: model_hash=7"),
    (dict(meta=_set("heldout_rel_error", ["x"])), "bad metadata: heldout_rel_error=\\['x'\\]"),
    (dict(tensors=lambda t: {**t, "weights": t["weights"].to(torch.int32)}), "holds weights torch.int32"),
    (dict(tensors=lambda t: {**t, "biases": t["biases"].double()}), "biases torch.float64"),
])
def test_load_maps_bad_metadata(tmp_path, maps, edit, message):
    src = maps.save(tmp_path / "m.safetensors")
    with pytest.raises(MapsFormatError, match=message):
        load_maps(_rewrite(src, tmp_path / "bad.safetensors", **edit))


def test_load_maps_keeps_unknown_keys(tmp_path, maps):
    src = maps.save(tmp_path / "m.safetensors")
    back = load_maps(_rewrite(src, tmp_path / "extra.safetensors", meta=_set("note", {"any": ["thing"]})))
    assert back.meta["note"] == {"any": ["thing"]} and back.split == S
    assert torch.equal(back.weights, maps.weights)


# ------------------------------------------------------------------------------------------------
# Case 6: solve_ridge with non-finite statistics raises NonFiniteError, not SingularGramError
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which, value", [("gram", float("nan")), ("gram", float("inf")), ("cross", float("nan")),
                                          ("cross", float("-inf"))])
def test_solve_ridge_non_finite(which, value):
    g = torch.eye(4, dtype=torch.float64) * 3
    b = torch.ones(4, 4, dtype=torch.float64)
    (g if which == "gram" else b)[1, 2] = value
    with pytest.raises(NonFiniteError, match=f"{'the Gram matrix G' if which == 'gram' else 'the cross term B'} "
                                             "given to solve_ridge holds 1 NaN or Inf"):
        solve_ridge(g, b, 1.0)


def test_solve_ridge_singular_still_singular():
    with pytest.raises(SingularGramError, match="use λ > 0"):
        solve_ridge(torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, 3, dtype=torch.float64), 0.0)


@pytest.mark.parametrize("lam", [True, "1", None, float("nan"), float("inf"), -0.5])
def test_solve_ridge_bad_lambda(lam):
    with pytest.raises(InputError, match="ridge λ must be a finite number ≥ 0.0"):
        solve_ridge(torch.eye(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64), lam)


@pytest.mark.parametrize("lam", [True, "one", float("nan"), -1.0, [1.0, "a", 1.0], [1.0]])
def test_fit_maps_bad_lambda(lam):
    stats = RidgeStats(3, 4)
    g = torch.Generator().manual_seed(0)
    stats.update(torch.randn(20, 4, generator=g), torch.randn(3, 20, 4, generator=g))
    with pytest.raises(InputError, match="λ"):
        fit_maps(stats, lam)


def test_fit_maps_non_finite_stats():
    stats = RidgeStats(2, 4)
    stats.update(torch.randn(20, 4), torch.randn(2, 20, 4))
    stats.cross[1, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"calibration statistics stats\.cross holds 1 NaN"):
        fit_maps(stats, 1.0)


# ------------------------------------------------------------------------------------------------
# Case 7: prefill argument types
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(tail=2.5), "tail must be an integer in 1..16; got 2.5 \\(float\\)"),
    (dict(tail=True), "tail must be an integer in 1..16; got True \\(bool\\)"),
    (dict(tail=17), "tail must be an integer in 1..16; got 17"),
    (dict(tail=0), "tail must be an integer in 1..16; got 0"),
    (dict(tail=4, logits="all"), "logits must be one of \\('last', 'exact'\\); got 'all'"),
    (dict(tail=4, mode="Ridge"), "mode must be one of"),
    (dict(tail=4, exact_rows=[1.5]), "exact_rows must hold integer row positions; got \\[1.5\\]"),
    (dict(tail=4, exact_rows=[True]), "exact_rows must hold integer row positions"),
    (dict(tail=4, exact_rows=[16]), "exact_rows must lie in 0..15"),
    (dict(tail=4, exact_rows=torch.tensor([1.0])), "exact_rows must be integer row positions"),
    (dict(tail=4, split=True), "split must be an integer ≥ 0; got True"),
    (dict(tail=4, split=1.0, mode="identity"), "split must be an integer ≥ 0; got 1.0"),
    (dict(tail=4, kv_hook="x", mode="identity", split=1), "kv_hook must be callable"),
])
def test_prefill_bad_arguments(model, maps, kwargs, message):
    ids = torch.randint(0, 101, (1, 16))
    with pytest.raises(InputError, match=message):
        prefill_instrumented(model, ids, maps, **{"select": None, **kwargs})


def test_prefill_bad_ids_and_maps(model, maps):
    with pytest.raises(InputError, match="input_ids must be an int64 tensor \\[batch, rows\\]; got list"):
        prefill(model, [[1, 2, 3]], maps, tail=1, select=None)
    with pytest.raises(InputError, match="got torch.int32"):
        prefill(model, torch.ones(1, 8, dtype=torch.int32), maps, tail=1, select=None)
    with pytest.raises(InputError, match="maps must be a RidgeMaps"):
        prefill(model, torch.ones(1, 8, dtype=torch.long), {"split": 2}, tail=1, select=None)


def test_prefill_exact_rows_tensor_accepted(model, maps):
    ids = torch.randint(0, 101, (1, 16))
    a = prefill_instrumented(model, ids, maps, tail=4, exact_rows=torch.tensor([2, 5]), logits="exact", select=None)
    b = prefill_instrumented(model, ids, maps, tail=4, exact_rows=[2, 5], logits="exact", select=None)
    assert a.exact_positions.tolist() == [2, 5, 12, 13, 14, 15]
    assert torch.equal(a.logits, b.logits)


# ------------------------------------------------------------------------------------------------
# calibrate: bad arguments fail before the pass
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(split=True), "split S must be an integer ≥ 0; got True"),
    (dict(split=2.0), "split S must be an integer ≥ 0; got 2.0"),
    (dict(split=5), "split S must be an integer in 0..4"),
    (dict(tokens=512.0), "tokens must be an integer ≥ 1"),
    (dict(chunk=True), "chunk must be an integer ≥ 2"),
    (dict(lam="Auto"), "λ must be a finite number ≥ 0.0; got 'Auto'"),
    (dict(lam=float("nan")), "λ must be a finite number"),
    (dict(heldout_every=0), "heldout_every must be an integer ≥ 1"),
    (dict(texts=TEXT), "not one string"),
    (dict(texts=[TEXT, b"bytes"]), "every calibration text must be a str"),
    (dict(checkpoint_every=0, checkpoint="x.safetensors"), "checkpoint_every must be an integer ≥ 1"),
])
def test_calibrate_bad_arguments(model, kwargs, message):
    args = dict(texts=[TEXT], split=S, tokens=512, chunk=128, lam="auto", progress=False)
    args.update(kwargs)
    texts = args.pop("texts")
    with pytest.raises(InputError, match=message):
        calibrate(model, CharTokenizer(), texts, **args)


# ------------------------------------------------------------------------------------------------
# load_stats and the CLI
# ------------------------------------------------------------------------------------------------

def test_load_stats_bad_metadata(tmp_path, maps):
    path = stats_path(maps.save(tmp_path / "m.safetensors"))
    stats, meta = load_stats(path)
    assert stats.count == maps.meta["calibration_tokens"]
    with safe_open(str(path), framework="pt") as f:
        ts = {k: f.get_tensor(k) for k in f.keys()}
    for bad, message in [({**meta, "layers": True}, "layers=True"), ({**meta, "count": "7"}, "count='7'"),
                         ({k: v for k, v in meta.items() if k != "hidden"}, "hidden missing")]:
        save_file(ts, str(path), metadata={"ridgefill_stats": json.dumps(bad)})
        with pytest.raises(MapsFormatError, match=message):
            load_stats(path)
    ts["gram"][0, 0] = float("nan")
    save_file(ts, str(path), metadata={"ridgefill_stats": json.dumps(meta)})
    with pytest.raises(MapsFormatError, match="tensor gram holds NaN or Inf"):
        load_stats(path)


def test_cli_bad_inputs_exit_2(tmp_path, capsys, gguf_file):
    from ridgefill.cli import main

    path, _ = gguf_file
    prompt = tmp_path / "p.txt"
    prompt.write_bytes(b"\xff\xfe not utf-8")
    assert main(["generate", "--model", str(path), "--prompt-file", str(prompt), "--mode", "exact"]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
    prompt.write_text("Hello there, a prompt.")
    assert main(["generate", "--model", str(path), "--prompt-file", str(prompt), "--mode", "exact",
                 "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens 0 must be at least 1" in capsys.readouterr().err
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:1000])
    assert main(["generate", "--model", str(cut), "--prompt-file", str(prompt), "--mode", "exact"]) == 2
    assert "is truncated or corrupted" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Calibration survives interruption: checkpoint, resume, bit-identical maps
# ------------------------------------------------------------------------------------------------

CAL = dict(split=1, tokens=2048, chunk=128, lam="auto", model_name="tiny", progress=False)


def _same_maps(a: RidgeMaps, b: RidgeMaps) -> None:
    assert torch.equal(a.weights, b.weights) and torch.equal(a.biases, b.biases)
    assert a.lambdas == b.lambdas and a.meta == b.meta
    for k in ("gram", "cross", "sum_h", "sum_x", "sq_x", "shift_h", "shift_x"):
        assert torch.equal(getattr(a.stats, k), getattr(b.stats, k)), k


def test_interrupted_calibration_resumes_bit_identical(tmp_path, model, monkeypatch):
    texts = [TEXT, TEXT[::-1]]
    reference = calibrate(model, CharTokenizer(), texts, **CAL)  # 16 chunks, no checkpoint
    rng = random.Random(20261201)
    ckpt = checkpoint_path(tmp_path / "maps.safetensors")
    assert ckpt.name == "maps.checkpoint.safetensors"
    stops, done = [], 0
    for attempt in range(3):  # interrupt three times at random chunks, then let it finish
        stop = rng.randrange(1, 16 - done)  # chunks computed in this attempt before the interruption
        stops.append(done + stop)
        calls = {"n": 0}
        real = RidgeStats.update

        def failing(self, h, xs, calls=calls, stop=stop, real=real):
            calls["n"] += 1
            if calls["n"] > stop:
                raise KeyboardInterrupt(f"injected interruption at chunk {stop}")
            real(self, h, xs)

        monkeypatch.setattr(RidgeStats, "update", failing)
        with pytest.raises(KeyboardInterrupt):
            calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, checkpoint_every=3, **CAL)
        monkeypatch.setattr(RidgeStats, "update", real)
        with safe_open(str(ckpt), framework="pt") as f:
            done = json.loads(f.metadata()["ridgefill_checkpoint"])["done"]
        assert done == stops[-1] // 3 * 3  # saved every 3 chunks
    resumed = calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, checkpoint_every=3, **CAL)
    print(f"\ninterrupted at chunks {stops} of 16; resumed maps equal the uninterrupted run bit for bit")
    _same_maps(reference, resumed)
    # a finished checkpoint resumes to the same maps without any forward pass
    monkeypatch.setattr(RidgeStats, "update", lambda *a: pytest.fail("no chunk should be recomputed"))
    _same_maps(reference, calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, checkpoint_every=3, **CAL))


def test_checkpoint_with_other_settings_is_refused(tmp_path, model):
    ckpt = tmp_path / "c.checkpoint.safetensors"
    texts = [TEXT, TEXT[::-1]]
    calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, checkpoint_every=4, **CAL)
    with pytest.raises(InputError, match=r"other settings \(chunks: 16 in the checkpoint, 8 now; chunks_sha256"):
        calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, **{**CAL, "tokens": 1024})
    with pytest.raises(InputError, match=r"splits: \[1\] in the checkpoint, \[2\] now.*delete"):
        calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, **{**CAL, "split": 2})
    with pytest.raises(InputError, match="weight_fingerprint"):
        calibrate(tiny_llama(seed=8), CharTokenizer(), texts, checkpoint=ckpt, **CAL)
    ckpt.write_bytes(b"garbage")
    with pytest.raises(MapsFormatError, match="calibration checkpoint .* is unreadable"):
        calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, **CAL)


_CHILD = textwrap.dedent("""
    import sys, time, torch
    torch.set_num_threads(1)
    sys.path[:0] = [{tests!r}, {python!r}]
    from conftest import tiny_llama
    from ridgefill.calibration import calibrate
    from ridgefill.ridge import RidgeStats

    class CharTokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {{"input_ids": [b % 101 for b in text.encode()]}}

    TEXT = {text!r}
    CAL = {cal!r}
    mode, ckpt, out = sys.argv[1:4]
    if mode == "slow":  # slow each chunk down so the parent can kill the process mid-pass
        real = RidgeStats.update
        def slow(self, h, xs):
            time.sleep(0.15)
            real(self, h, xs)
        RidgeStats.update = slow
    model = tiny_llama(seed=7)
    maps = calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], checkpoint=ckpt, checkpoint_every=1, **CAL)
    maps.save(out)
    if mode == "resume":  # the uninterrupted reference, in the same process (same threads)
        calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], **CAL).save(out.replace("resumed", "reference"))
""")


def test_killed_calibration_resumes_bit_identical(tmp_path):
    """SIGKILL a calibrating process at a random chunk, resume in a new process, compare with an
    uninterrupted calibration bit for bit."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(REPO / "tests"), python=str(REPO / "python"), text=TEXT, cal=CAL))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ckpt = tmp_path / "run.checkpoint.safetensors"
    kill_after = random.Random(7).randrange(2, 12)  # chunks done when the kill comes
    p = subprocess.Popen([sys.executable, str(script), "slow", str(ckpt), str(tmp_path / "never.safetensors")],
                         env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    done = 0
    while done < kill_after and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
        if ckpt.exists():
            try:
                with safe_open(str(ckpt), framework="pt") as f:
                    done = json.loads(f.metadata()["ridgefill_checkpoint"])["done"]
            except Exception:  # noqa: BLE001 - the file is being replaced; poll again
                pass
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL and 0 < done < 16, (p.returncode, done, p.stderr.read()[-2000:])
    assert not (tmp_path / "never.safetensors").exists()
    resumed = tmp_path / "resumed.safetensors"
    r = subprocess.run([sys.executable, str(script), "resume", str(ckpt), str(resumed)], env=env,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    a, b = load_maps(tmp_path / "reference.safetensors"), load_maps(resumed)
    print(f"\nkilled (SIGKILL) after {done} of 16 chunks; resumed maps equal the uninterrupted run bit for bit")
    assert torch.equal(a.weights, b.weights) and torch.equal(a.biases, b.biases) and a.lambdas == b.lambdas
    sa, sb = load_stats(stats_path(tmp_path / "reference.safetensors")), load_stats(stats_path(resumed))
    assert torch.equal(sa[0].cross, sb[0].cross) and torch.equal(sa[0].gram, sb[0].gram) and sa[1] == sb[1]


# ------------------------------------------------------------------------------------------------
# Concurrent saves never leave a mixed maps/statistics pair
# ------------------------------------------------------------------------------------------------

def _saver(path: str, seed: int, rounds: int) -> None:
    torch.set_num_threads(1)  # a forked child must not use the parent's OpenMP pool
    g = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        stats = RidgeStats(2, 16)
        stats.update(torch.randn(40, 16, generator=g), torch.randn(2, 40, 16, generator=g))
        fitted = fit_maps(stats, 1.0)
        RidgeMaps(0, fitted.weights.float(), fitted.biases.float(), fitted.lambdas, {"seed": seed},
                  fitted.stats).save(path)


def test_concurrent_saves_leave_a_matching_pair(tmp_path):
    path = tmp_path / "pair.safetensors"
    ctx = multiprocessing.get_context("spawn")  # forking a process whose OpenMP pool has run can hang the child
    procs = [ctx.Process(target=_saver, args=(str(path), seed, 25)) for seed in (1, 2, 3)]
    for p in procs:
        p.start()
    for _ in range(200):  # meanwhile, every pair read under the lock matches
        if path.exists():
            from ridgefill.fileio import file_lock
            from ridgefill.maps import pair_lock_path

            with file_lock(pair_lock_path(path)):
                m = load_maps(path)
                _, smeta = load_stats(stats_path(path))
            assert smeta["maps_sha256"] == maps_digest(m.weights, m.biases)
        time.sleep(0.005)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    m = load_maps(path)
    _, smeta = load_stats(stats_path(path))
    assert smeta["maps_sha256"] == maps_digest(m.weights, m.biases)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair.safetensors", "pair.stats.safetensors"]  # no lock file


def test_removed_lock_file_still_excludes(tmp_path):
    """file_lock(remove=True) deletes the lock file as it lets go; a taker that waited on the deleted file
    starts again on the new one, so two holders never overlap (threads: flock locks open files, so two
    opens in one process exclude each other as two processes do)."""
    import threading

    from ridgefill.fileio import file_lock

    lock = tmp_path / ".x.lock"
    inside, most, errors = [0], [0], []

    def worker():
        try:
            for _ in range(60):
                with file_lock(lock, remove=True):
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    time.sleep(0.0005)
                    inside[0] -= 1
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and most[0] == 1
    assert not lock.exists()


def test_maps_file_replaced_while_read(tmp_path, maps, monkeypatch):
    """A maps file replaced (renamed over) between reading its metadata and its tensors loads whole: the
    old file's metadata with the old file's tensors, never a mix."""
    import ridgefill.maps as maps_module

    path = maps.save(tmp_path / "m.safetensors")
    newer = RidgeMaps(maps.split, maps.weights + 1, maps.biases - 1, [7.0] * len(maps.lambdas),
                      dict(maps.meta)).save(tmp_path / "new.safetensors")
    real = maps_module.safe_open

    class Racing:
        def __init__(self, *args, **kwargs):
            self.f = real(*args, **kwargs)

        def __enter__(self):
            self.inner = self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def metadata(self):
            out = self.inner.metadata()
            os.replace(newer, path)  # another run replaces the file right now
            return out

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, k):
            return self.inner.get_tensor(k)

    monkeypatch.setattr(maps_module, "safe_open", Racing)
    got = load_maps(path)
    assert got.lambdas == maps.lambdas and torch.equal(got.weights, maps.weights)
    monkeypatch.setattr(maps_module, "safe_open", real)
    assert load_maps(path).lambdas == [7.0] * len(maps.lambdas)  # the replacement is what is there now


def test_save_without_stats_removes_stale_stats(tmp_path, maps):
    path = maps.save(tmp_path / "m.safetensors")
    assert stats_path(path).exists()
    RidgeMaps(maps.split, maps.weights, maps.biases, maps.lambdas, dict(maps.meta)).save(path)
    assert not stats_path(path).exists()


# ------------------------------------------------------------------------------------------------
# Fuzz: maps and statistics files
# ------------------------------------------------------------------------------------------------

_VALUES = [None, True, False, 0, 1, -1, 2, 2.5, -1.0, float("nan"), float("inf"), "a", "", [], ["a"], [None],
           [1.0], [-1.0], {}, {"a": 1}, 10 ** 30]


def _mutations(data: bytes, meta: dict, tensors: dict, rng: random.Random, count: int):
    """Yield ``(label, bytes)``: truncations, random bytes, and metadata/tensor edits written anew."""
    from safetensors.torch import save as save_bytes

    header = 8 + int.from_bytes(data[:8], "little")
    for i in range(count):
        kind = i % 5
        if kind == 0:
            yield "truncate", data[:rng.randrange(0, len(data))]
        elif kind == 1:
            d = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                d[rng.randrange(0, len(d))] = rng.randrange(256)
            yield "bytes", bytes(d)
        elif kind == 2:
            d = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                d[rng.randrange(0, header)] = rng.randrange(256)
            yield "header bytes", bytes(d)
        elif kind == 3:
            m = dict(meta)
            key = rng.choice(sorted(m) + ["split", "lambdas", "format_version"])
            if rng.random() < 0.2:
                m.pop(key, None)
            elif key == "lambdas" and rng.random() < 0.5:
                m[key] = [rng.choice(_VALUES) for _ in meta.get("lambdas", [0.0])]
            else:
                m[key] = rng.choice(_VALUES)
            raw = rng.choice([json.dumps(m), json.dumps(m)[:-1], json.dumps(list(m)), "null", "1e999"])
            yield f"metadata {key}", save_bytes(tensors, metadata={_fuzz_key(meta): raw})
        else:
            ts = dict(tensors)
            name = rng.choice(sorted(ts))
            t = ts[name]
            op = rng.randrange(4)
            ts[name] = (t.to(rng.choice([torch.int32, torch.float16, torch.float64, torch.bfloat16])) if op == 0
                        else t.flatten()[: max(1, t.numel() // 2)] if op == 1
                        else t.unsqueeze(0) if op == 2 else t * float("nan"))
            if rng.random() < 0.3:
                ts["extra"] = torch.zeros(2)
            yield f"tensor {name} op {op}", save_bytes(ts, metadata={_fuzz_key(meta): json.dumps(meta)})


def _fuzz_key(meta: dict) -> str:
    return "ridgefill_stats" if "hidden" in meta else "ridgefill"


def _check_maps(m: RidgeMaps) -> None:
    """A correct load: the invariants every RidgeMaps from load_maps has."""
    assert type(m.split) is int and m.split >= 0
    assert m.weights.dtype == m.biases.dtype == torch.float32 and m.weights.ndim == 3
    assert m.weights.shape[1] == m.weights.shape[2] and m.biases.shape == m.weights.shape[:2]
    assert len(m.lambdas) == m.weights.shape[0] and all(type(v) is float and math.isfinite(v) and v >= 0
                                                        for v in m.lambdas)
    assert torch.isfinite(m.weights).all() and torch.isfinite(m.biases).all() and isinstance(m.meta, dict)


def _check_stats(result) -> None:
    stats, meta = result
    assert isinstance(meta, dict) and type(stats.count) is int and stats.count >= 1
    for k in ("gram", "cross", "sum_h", "sum_x", "sq_x", "shift_h", "shift_x"):
        t = getattr(stats, k)
        assert t.dtype == torch.float64 and torch.isfinite(t).all()
    assert stats.cross.shape == (stats.layers, stats.hidden, stats.hidden)


def _fuzz(tmp_path, src: Path, key: str, loader, check, count: int, seed: int) -> dict:
    data = src.read_bytes()
    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()[key])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    rng = random.Random(seed)
    outcome = {"tried": 0, "clean error": 0, "loaded": 0, "failures": []}
    target = tmp_path / "fuzz.safetensors"
    for label, blob in _mutations(data, meta, tensors, rng, count):
        target.write_bytes(blob)
        outcome["tried"] += 1
        try:
            result = loader(target)
        except MapsFormatError:
            outcome["clean error"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - any other exception is what the fuzz looks for
            outcome["failures"].append(f"{label}: {type(e).__name__}: {e}"[:300])
            continue
        try:
            check(result)
            outcome["loaded"] += 1
        except AssertionError as e:
            outcome["failures"].append(f"{label}: loaded but wrong: {e}"[:300])
    return outcome


def test_fuzz_maps_file(tmp_path, maps):
    src = maps.save(tmp_path / "m.safetensors")
    out = _fuzz(tmp_path, src, "ridgefill", load_maps, _check_maps, count=600, seed=14)
    print(f"\nmaps-file fuzz: {out['tried']} inputs tried, {out['clean error']} MapsFormatError, "
          f"{out['loaded']} correct loads, {len(out['failures'])} failures")
    assert out["tried"] == 600 and out["failures"] == []
    assert out["clean error"] > 300 and out["loaded"] > 10  # both outcomes occur


def test_fuzz_stats_file(tmp_path, maps):
    src = stats_path(maps.save(tmp_path / "m.safetensors"))
    out = _fuzz(tmp_path, src, "ridgefill_stats", load_stats, _check_stats, count=400, seed=15)
    print(f"\nstatistics-file fuzz: {out['tried']} inputs tried, {out['clean error']} MapsFormatError, "
          f"{out['loaded']} correct loads, {len(out['failures'])} failures")
    assert out["tried"] == 400 and out["failures"] == []
    assert out["clean error"] > 200 and out["loaded"] > 0  # content hashes refuse every header field edit


# ------------------------------------------------------------------------------------------------
# Fuzz: GGUF headers
# ------------------------------------------------------------------------------------------------

def _gguf_mutations(data: bytes, data_start: int, rng: random.Random, count: int):
    for i in range(count):
        kind = i % 3
        if kind == 0:
            yield "truncate", data[:rng.randrange(0, data_start + 64)]
        elif kind == 1:
            d = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                d[rng.randrange(0, data_start)] = rng.randrange(256)
            yield "header bytes", bytes(d)
        else:
            d = bytearray(data)
            p = rng.randrange(0, data_start - 8)
            d[p:p + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, rng.randbytes(8), (2 ** 62).to_bytes(8, "little")])
            yield "header word", bytes(d)


def test_fuzz_gguf_header_reader(tmp_path, gguf_file):
    """check_gguf on many mutated headers: AssetError or a file whose index is sound."""
    path, _ = gguf_file
    data = path.read_bytes()
    _, data_start = metadata_end(path)
    target = tmp_path / "f.gguf"
    counts = {"tried": 0, "AssetError": 0, "passed": 0}
    failures = []
    for label, blob in _gguf_mutations(data, data_start, random.Random(140), 400):
        target.write_bytes(blob)
        counts["tried"] += 1
        try:
            check_gguf(target)
            counts["passed"] += 1
        except AssetError:
            counts["AssetError"] += 1
        except Exception as e:  # noqa: BLE001
            failures.append(f"{label}: {type(e).__name__}: {e}"[:300])
    print(f"\nGGUF header fuzz (check_gguf): {counts['tried']} inputs tried, {counts['AssetError']} AssetError, "
          f"{counts['passed']} passed, {len(failures)} failures")
    assert counts["tried"] == 400 and failures == []
    assert counts["AssetError"] > 200 and counts["passed"] > 20


def test_fuzz_gguf_load_model(tmp_path, gguf_file):
    """load_model on mutated GGUF headers: AssetError, or a model whose weights are the source's."""
    path, source = gguf_file
    data = path.read_bytes()
    _, data_start = metadata_end(path)
    want = dict(source.named_parameters())
    target = tmp_path / "f.gguf"
    counts = {"tried": 0, "AssetError": 0, "loaded": 0}
    failures = []
    for label, blob in _gguf_mutations(data, data_start, random.Random(141), 45):
        target.write_bytes(blob)
        counts["tried"] += 1
        try:
            model, _, _ = load_model(target)
        except AssetError:
            counts["AssetError"] += 1
            continue
        except Exception as e:  # noqa: BLE001
            failures.append(f"{label}: {type(e).__name__}: {e}"[:300])
            continue
        got = dict(model.named_parameters())
        if set(got) != set(want) or not all(torch.equal(got[k], want[k]) for k in want):
            failures.append(f"{label}: loaded with weights other than the source's")
        else:
            counts["loaded"] += 1
    print(f"\nGGUF header fuzz (load_model): {counts['tried']} inputs tried, {counts['AssetError']} AssetError, "
          f"{counts['loaded']} correct loads, {len(failures)} failures")
    assert counts["tried"] == 45 and failures == []
    assert counts["AssetError"] > 10


# ------------------------------------------------------------------------------------------------
# Found by a review on a clean clone: numpy integers, token ids, huge numbers, a failed save
# ------------------------------------------------------------------------------------------------

def test_numpy_integers_are_used_as_ints(model, maps):
    import numpy as np

    ids = torch.randint(0, 101, (1, 24), generator=torch.Generator().manual_seed(3))
    res = prefill(model, ids, maps, tail=np.int64(4), mode="ridge", select=None)
    assert generate_after(model, ids, res, np.int64(2)).shape == (1, 2)


def test_token_ids_outside_the_vocabulary_are_refused(model, maps):
    for bad in (torch.full((1, 8), 500), torch.full((1, 8), -1), torch.zeros((0, 8), dtype=torch.long)):
        with pytest.raises(InputError, match="token ids in 0..100"):
            prefill(model, bad, maps, tail=2, mode="ridge", select=None)


def test_huge_integers_in_metadata_and_lambda_are_clean_errors(tmp_path, maps):
    src = maps.save(tmp_path / "m.safetensors")
    with pytest.raises(MapsFormatError):
        load_maps(_rewrite(src, tmp_path / "big.safetensors", meta=_set("lambdas", [10 ** 400] * len(maps.lambdas))))
    with pytest.raises(InputError, match="finite number"):
        solve_ridge(torch.eye(3), torch.eye(3), 10 ** 400)


def test_a_failed_save_leaves_the_old_pair_whole(tmp_path, maps):
    """Metadata that cannot be stored is refused before anything is written: the old maps and
    statistics stay a matching pair."""
    import numpy as np
    from ridgefill.maps import maps_digest

    path = tmp_path / "pair.safetensors"
    maps.save(path)
    bad = RidgeMaps(maps.split, maps.weights * 2, maps.biases, maps.lambdas, dict(maps.meta, chunk=np.int64(128)),
                    maps.stats)
    with pytest.raises(InputError, match="JSON"):
        bad.save(path)
    back, (_, smeta) = load_maps(path), load_stats(stats_path(path))
    assert torch.equal(back.weights, maps.weights) and smeta["maps_sha256"] == maps_digest(back.weights, back.biases)
    with pytest.raises(InputError, match="is a folder"):
        maps.save(tmp_path)
