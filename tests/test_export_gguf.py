"""``ridgefill export-gguf``: maps as GGUF for the llama.cpp engine (docs/maps-format.md, "GGUF maps").
Checked here: the round trip of weights, biases and metadata (context and plain maps), the transposed layout
that ggml's mul_mat reads (x̂ = h W + b recomputed from the stored tensor), the content checksum and the model
fingerprint stored (recomputed as docs/maps-format.md words them), what the fingerprint tells apart, the
CLI, and the errors (K/V maps, a tail out of range checked before the maps load, non-finite maps, a model
file of another shape or no model file, a GGUF given as the maps, a bad output name, a missing file).
tests_llamacpp/ checks that the patched llama.cpp computes the same fingerprint and refuses what differs."""
import copy
import hashlib
import struct
import time

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from ridgefill.calibration import calibrate
from ridgefill.cli import main
from ridgefill.errors import InputError, MapsFormatError
from ridgefill.export_gguf import MAX_TAIL, export_gguf, maps_sha256, model_fingerprint, read_gguf_maps
from ridgefill.maps import context_features, predict_inputs

S = 1
TEXT = "".join(chr(97 + (i * 5 + i // 11) % 26) + (" " if i % 6 == 5 else "") for i in range(2000))


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 101 for c in text]}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=5)


def write_model_gguf(path, layers=6, width=64, seed=0, arch="llama"):
    """A small GGUF "model" file: the metadata export-gguf reads (layers, width) and a few tensors, one of
    them 10,000 bytes long (longer than the 4,096 bytes the fingerprint reads)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(width)
    w.add_tensor("token_embd.weight", rng.standard_normal((10, width)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((width, width)).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    w.add_tensor("blk.0.big.weight", rng.standard_normal(2500).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    return write_model_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module", params=[0, 1], ids=["plain", "context"])
def maps(model, request):
    return calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=512, chunk=128, progress=False,
                     context=request.param)


def test_round_trip_and_layout(maps, gguf_model, tmp_path):
    path = export_gguf(maps, tmp_path / "m.gguf", model=gguf_model, tail=32)
    got = read_gguf_maps(path)
    layers, f, d = maps.weights.shape
    assert (got["split"], got["context"], got["tail"], got["format_version"]) == (S, maps.context, 32, 2)
    assert (got["model_fingerprint"], got["model_file"]) == (model_fingerprint(gguf_model), "tiny.gguf")
    assert (got["n_layer"], got["n_embd"]) == (S + 1 + layers, d)
    assert sorted(got["weights"]) == sorted(got["biases"]) == list(range(S + 1, S + 1 + layers))
    for i, layer in enumerate(range(S + 1, S + 1 + layers)):
        assert np.array_equal(got["weights"][layer], maps.weights[i].numpy())
        assert np.array_equal(got["biases"][layer], maps.biases[i].numpy())
    # the stored array is W_lᵀ, [d, f] row-major: ggml reads it as [f, d] and mul_mat(W, features) = h W
    import gguf

    t = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}[f"ridgefill.weight.{S + 1}"]
    assert [int(x) for x in t.shape] == [f, d]
    h = torch.randn(1, 7, d)
    feats = context_features(h, maps.context)
    stored = torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(d, f))
    ggml_like = feats[0] @ stored.T + maps.biases[0]
    assert torch.allclose(ggml_like, predict_inputs(feats, maps.weights[0], maps.biases[0])[0], atol=1e-5)


def test_checksum_is_the_stored_tensors_in_order(maps, gguf_model, tmp_path):
    """ridgefill.maps_sha256 is the SHA-256 of the tensors' data as stored, layer by layer, weight then bias
    (what llama.cpp recomputes from the file)."""
    import gguf

    path = export_gguf(maps, tmp_path / "m.gguf", model=gguf_model)
    r = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in r.tensors}
    h = hashlib.sha256()
    for layer in range(S + 1, S + 1 + maps.weights.shape[0]):
        for kind in ("weight", "bias"):
            t = by_name[f"ridgefill.{kind}.{layer}"]
            h.update(r.data[t.data_offset:t.data_offset + int(t.n_bytes)].tobytes())
    assert read_gguf_maps(path)["maps_sha256"] == h.hexdigest()
    assert h.hexdigest() == maps_sha256(maps.weights.numpy(), maps.biases.numpy())


def test_model_fingerprint(tmp_path):
    """The fingerprint as docs/maps-format.md words it; another seed (same names, types and shapes) or a
    byte changed within a tensor's first 4,096 bytes changes it; a byte past them does not (not checked)."""
    import gguf

    a = write_model_gguf(tmp_path / "a.gguf", seed=1)
    r = gguf.GGUFReader(str(a))
    h = hashlib.sha256()
    for t in sorted(r.tensors, key=lambda t: t.name):
        ne = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
        h.update(t.name.encode() + b"\0" + struct.pack("<I4q", int(t.tensor_type), *ne))
        h.update(r.data[t.data_offset:t.data_offset + min(4096, int(t.n_bytes))].tobytes())
    big = next(t for t in r.tensors if t.name == "blk.0.big.weight")
    start = int(big.data_offset)
    del r
    assert model_fingerprint(a) == h.hexdigest()
    assert model_fingerprint(write_model_gguf(tmp_path / "b.gguf", seed=2)) != model_fingerprint(a)
    data = bytearray(a.read_bytes())
    for offset, seen in ((start + 100, True), (start + 5000, False)):
        changed = bytearray(data)
        changed[offset] ^= 0x40
        (tmp_path / "c.gguf").write_bytes(changed)
        assert (model_fingerprint(tmp_path / "c.gguf") != model_fingerprint(a)) == seen


def test_cli_writes_the_file(maps, gguf_model, tmp_path, capsys):
    src = tmp_path / "maps.safetensors"
    maps.save(src)
    out = tmp_path / "maps.gguf"
    model = ["--model", str(gguf_model)]
    assert main(["export-gguf", str(src), *model, "--out", str(out), "--tail", "64"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert read_gguf_maps(out)["tail"] == 64
    assert main(["export-gguf", str(src), *model, "--out", str(tmp_path / "maps.bin")]) == 2
    assert "must name a .gguf file" in capsys.readouterr().err
    assert main(["export-gguf", str(tmp_path / "none.safetensors"), *model, "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    # a GGUF given as the maps: the message says what the input must be
    assert main(["export-gguf", str(out), *model, "--out", str(tmp_path / "again.gguf")]) == 2
    err = capsys.readouterr().err
    assert "is a GGUF file" in err and "safetensors maps" in err and "ridgefill calibrate" in err
    # no model, or a model file that is not GGUF
    assert main(["export-gguf", str(src), "--out", str(out)]) == 2
    assert "required: --model" in capsys.readouterr().err
    assert main(["export-gguf", str(src), "--model", str(src), "--out", str(out)]) == 2
    assert "is not a GGUF file" in capsys.readouterr().err
    assert main(["export-gguf", str(src), "--model", str(tmp_path / "none.gguf"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("tail", ["0", "-1", str(2**31), "99999999999"])
def test_cli_tail_out_of_range_is_refused_first(tail, gguf_model, tmp_path, capsys, monkeypatch):
    """A tail out of 1..2^31-1 is one error line naming the range (no traceback), before the maps load."""
    import ridgefill.maps

    monkeypatch.setattr(ridgefill.maps, "load_maps", lambda *a, **k: pytest.fail("the maps must not load"))
    t0 = time.perf_counter()
    assert main(["export-gguf", str(tmp_path / "none.safetensors"), "--model", str(gguf_model),
                 "--out", str(tmp_path / "m.gguf"), "--tail", tail]) == 2
    err = capsys.readouterr().err
    assert f"tail={tail}" in err and f"1..{MAX_TAIL}" in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 5
    assert not (tmp_path / "m.gguf").exists()


def test_largest_tail_round_trips(maps, gguf_model, tmp_path):
    assert read_gguf_maps(export_gguf(maps, tmp_path / "m.gguf", model=gguf_model, tail=MAX_TAIL))["tail"] == MAX_TAIL


def test_errors(model, maps, gguf_model, tmp_path):
    for bad in (0, -3, True, 2.5, 2**31, 99999999999):
        with pytest.raises(InputError, match=r"tail.*1\.\.2147483647"):
            export_gguf(maps, tmp_path / "x.gguf", model=gguf_model, tail=bad)
    kv = calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=256, chunk=128, progress=False, context=0,
                   targets="kv")
    with pytest.raises(InputError, match="input maps"):
        export_gguf(kv, tmp_path / "kv.gguf", model=gguf_model)
    assert not (tmp_path / "kv.gguf").exists()
    with pytest.raises(InputError, match="RidgeMaps"):
        export_gguf({"weights": 1}, tmp_path / "y.gguf", model=gguf_model)
    # maps for another shape of model
    other = write_model_gguf(tmp_path / "other.gguf", layers=8)
    with pytest.raises(InputError, match="8 layers of width 64; these maps are for 6 layers"):
        export_gguf(maps, tmp_path / "z.gguf", model=other)
    with pytest.raises(InputError, match="does not exist"):
        export_gguf(maps, tmp_path / "z.gguf", model=tmp_path / "none.gguf")
    # a NaN in a bias, an infinity in a weight
    for name, index in (("biases", (1, 3)), ("weights", (0, 2, 5))):
        bad = copy.deepcopy(maps)
        getattr(bad, name)[index] = float("nan") if name == "biases" else float("inf")
        with pytest.raises(MapsFormatError, match=f"maps' {name} hold a non-finite value"):
            export_gguf(bad, tmp_path / "z.gguf", model=gguf_model)
    assert not (tmp_path / "z.gguf").exists()
    with pytest.raises(InputError, match="does not exist"):
        read_gguf_maps(tmp_path / "missing.gguf")
    (tmp_path / "not.gguf").write_bytes(b"nonsense")
    with pytest.raises(InputError, match="not a GGUF"):
        read_gguf_maps(tmp_path / "not.gguf")
