"""``ridgefill export-gguf``: maps as GGUF for the llama.cpp engine (docs/maps-format.md, "GGUF maps").
Checked here: the round trip of weights, biases and metadata (context and plain maps), the transposed layout
that ggml's mul_mat reads (x̂ = h W + b recomputed from the stored tensor), the CLI, and the errors (K/V
maps, a bad tail, a bad output name, a missing file)."""
import numpy as np
import pytest
import torch
from conftest import tiny_llama
from ridgefill.calibration import calibrate
from ridgefill.cli import main
from ridgefill.errors import InputError
from ridgefill.export_gguf import export_gguf, read_gguf_maps
from ridgefill.maps import context_features, predict_inputs

S = 1
TEXT = "".join(chr(97 + (i * 5 + i // 11) % 26) + (" " if i % 6 == 5 else "") for i in range(2000))


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 101 for c in text]}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=5)


@pytest.fixture(scope="module", params=[0, 1], ids=["plain", "context"])
def maps(model, request):
    return calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=512, chunk=128, progress=False,
                     context=request.param)


def test_round_trip_and_layout(maps, tmp_path):
    path = export_gguf(maps, tmp_path / "m.gguf", tail=32)
    got = read_gguf_maps(path)
    layers, f, d = maps.weights.shape
    assert (got["split"], got["context"], got["tail"], got["format_version"]) == (S, maps.context, 32, 1)
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


def test_cli_writes_the_file(maps, tmp_path, capsys):
    src = tmp_path / "maps.safetensors"
    maps.save(src)
    out = tmp_path / "maps.gguf"
    assert main(["export-gguf", str(src), "--out", str(out), "--tail", "64"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert read_gguf_maps(out)["tail"] == 64
    assert main(["export-gguf", str(src), "--out", str(tmp_path / "maps.bin")]) == 2
    assert "must name a .gguf file" in capsys.readouterr().err
    assert main(["export-gguf", str(tmp_path / "none.safetensors"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_errors(model, maps, tmp_path):
    for bad in (0, -3, True, 2.5):
        with pytest.raises(InputError, match="tail"):
            export_gguf(maps, tmp_path / "x.gguf", tail=bad)
    kv = calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=256, chunk=128, progress=False, context=0,
                   targets="kv")
    with pytest.raises(InputError, match="input maps"):
        export_gguf(kv, tmp_path / "kv.gguf")
    assert not (tmp_path / "kv.gguf").exists()
    with pytest.raises(InputError, match="RidgeMaps"):
        export_gguf({"weights": 1}, tmp_path / "y.gguf")
    with pytest.raises(InputError, match="does not exist"):
        read_gguf_maps(tmp_path / "missing.gguf")
    (tmp_path / "not.gguf").write_bytes(b"nonsense")
    with pytest.raises(InputError, match="not a GGUF"):
        read_gguf_maps(tmp_path / "not.gguf")
