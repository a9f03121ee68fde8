"""Maps file round trip and validation; calibration on a tiny model; bad input gives clear errors."""

import json
from pathlib import Path

import pytest
import torch

from ridgefill import (InputError, MapsFormatError, MapsMismatchError, RidgeMaps, load_maps, prefill)
from ridgefill.calibration import calibrate, calibration_chunks
from conftest import tiny_llama

S = 2


class CharTokenizer:
    """A tokenizer stand-in for tiny models: one token per byte, modulo the vocabulary."""

    def __init__(self, vocab=101):
        self.vocab = vocab

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [b % self.vocab for b in text.encode()]}


TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. " * 40)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=7)


@pytest.fixture(scope="module")
def maps(model):
    return calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], split=S, tokens=1024, chunk=128,
                     lam="auto", model_name="tiny", progress=False, context=0)


def test_calibrate_produces_valid_maps(model, maps):
    L, d = model.config.num_hidden_layers, model.config.hidden_size
    assert maps.split == S and maps.weights.shape == (L - S - 1, d, d) and maps.biases.shape == (L - S - 1, d)
    assert maps.meta["calibration_tokens"] == 1024 and maps.meta["heldout_tokens"] == 128
    assert all(v > 0 for v in maps.lambdas)
    # x_{S+1} = h_S exactly, so the first late layer's map is the identity (Lean: ridge_eq_prior_of_exact)
    torch.testing.assert_close(maps.weights[0], torch.eye(d), rtol=0, atol=1e-4)
    torch.testing.assert_close(maps.biases[0], torch.zeros(d), rtol=0, atol=1e-4)
    # and it beats the identity fill on held-out rows in the later layers
    assert all(r <= ri + 1e-9 for r, ri in zip(maps.meta["heldout_rel_error"], maps.meta["heldout_rel_error_identity"]))


def test_save_load_round_trip(tmp_path, model, maps):
    path = maps.save(tmp_path / "m.safetensors")
    back = load_maps(path)
    assert back.split == maps.split and back.lambdas == maps.lambdas
    assert torch.equal(back.weights, maps.weights) and torch.equal(back.biases, maps.biases)
    assert back.meta["model_hash"] == maps.meta["model_hash"]
    back.check_model(model, S)
    ids = torch.randint(0, 101, (1, 40))
    a = prefill(model, ids, maps, tail=4, select=None)
    b = prefill(model, ids, back, tail=4, select=None)
    assert torch.equal(a.logits, b.logits)


def test_maps_from_another_model_or_split(model, maps):
    other_arch = tiny_llama(seed=7, hidden=32)
    with pytest.raises(MapsMismatchError, match="shapes|weights"):
        maps.check_model(other_arch)
    other_weights = tiny_llama(seed=8)
    with pytest.raises(MapsMismatchError, match="other weights"):
        maps.check_model(other_weights)
    with pytest.raises(MapsMismatchError, match="split S=3"):
        prefill(model, torch.randint(0, 101, (1, 20)), maps, tail=4, split=3, select=None)
    deeper = tiny_llama(seed=7, layers=8)
    with pytest.raises(MapsMismatchError):
        prefill(deeper, torch.randint(0, 101, (1, 20)), maps, tail=4, select=None)


def test_wrong_shapes_in_file(tmp_path, maps):
    from safetensors.torch import save_file

    meta = {"format_version": 1, "split": S, "lambdas": maps.lambdas}
    save_file({"weights": maps.weights[:, :5].contiguous(), "biases": maps.biases}, tmp_path / "bad.safetensors",
              metadata={"ridgefill": json.dumps(meta)})
    with pytest.raises(MapsFormatError, match="inconsistent shapes"):
        load_maps(tmp_path / "bad.safetensors")
    save_file({"x": maps.biases}, tmp_path / "other.safetensors")
    with pytest.raises(MapsFormatError, match="not a RidgeFill maps file"):
        load_maps(tmp_path / "other.safetensors")


def test_truncated_and_corrupted_files(tmp_path, maps):
    path = maps.save(tmp_path / "m.safetensors")
    raw = path.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(MapsFormatError, match="truncated or corrupted"):
        load_maps(tmp_path / "trunc.safetensors")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00\x01 not safetensors" * 10)
    with pytest.raises(MapsFormatError):
        load_maps(tmp_path / "garbage.safetensors")
    nan = RidgeMaps(S, maps.weights.clone(), maps.biases.clone(), maps.lambdas, dict(maps.meta))
    nan.weights[0, 0, 0] = float("nan")
    nan.save(tmp_path / "nan.safetensors")
    with pytest.raises(MapsFormatError, match="NaN"):
        load_maps(tmp_path / "nan.safetensors")
    with pytest.raises(InputError, match="does not exist"):
        load_maps(tmp_path / "missing.safetensors")


def test_failed_run_never_overwrites_existing_maps(tmp_path, model, maps, monkeypatch):
    path = maps.save(tmp_path / "m.safetensors")
    before = path.read_bytes()
    import errno

    import ridgefill.fileio as fileio
    from ridgefill.errors import WriteError

    def full_disk(fh, data):  # a full disk, simulated: the write stops part way with ENOSPC
        fh.write(data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_write_bytes", full_disk)
    with pytest.raises(WriteError, match="no space left on device.*needs [0-9,]+ bytes in its folder"):
        maps.save(path)
    assert path.read_bytes() == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left
    # a calibration that fails (empty text) writes nothing either
    with pytest.raises(InputError, match="empty"):
        calibrate(model, CharTokenizer(), ["", "   "], split=S, tokens=256, chunk=64, progress=False, context=0)
    assert path.read_bytes() == before


def test_calibration_bad_input(model):
    tok = CharTokenizer()
    with pytest.raises(InputError, match="empty"):
        calibration_chunks(tok, [], 100, 64)
    with pytest.raises(InputError, match="one calibration chunk: give a longer text"):
        calibration_chunks(tok, ["short"], 100, 64)
    with pytest.raises(InputError, match=r"ask for fewer tokens \(`ridgefill calibrate --tokens`, `ridgefill eval "
                                         r"--calib-tokens`\) or add text"):
        calibration_chunks(tok, [TEXT], 10 ** 6, 64)
    with pytest.raises(InputError, match="split"):
        calibrate(model, tok, [TEXT], split=5, tokens=256, chunk=64, progress=False, context=0)
    with pytest.raises(InputError, match="split"):
        calibrate(model, tok, [TEXT], split=-1, tokens=256, chunk=64, progress=False, context=0)


def test_singular_gram_with_zero_lambda(model):
    from ridgefill import SingularGramError

    # 64 rows < hidden 64 + centring: the centred Gram is singular, so λ = 0 has no unique solution
    with pytest.raises(SingularGramError, match="λ > 0"):
        calibrate(model, CharTokenizer(), [TEXT], split=S, tokens=64, chunk=64, lam=0.0, progress=False, context=0)


def test_calibration_chunks_spread_over_texts():
    tok = CharTokenizer()
    chunks = calibration_chunks(tok, ["a" * 640, "b" * 640], 256, 64)
    assert len(chunks) == 4
    firsts = {int(c[0]) for c in chunks}
    assert firsts == {ord("a") % 101, ord("b") % 101}  # both texts used


class BosCharTokenizer(CharTokenizer):
    """A CharTokenizer that, like Gemma's, puts a BOS token (id 0) before a text by default."""

    def __call__(self, text, add_special_tokens=True, **kw):
        ids = super().__call__(text, add_special_tokens=False, **kw)["input_ids"]
        return {"input_ids": ([0] if add_special_tokens else []) + list(ids)}


def test_special_prefix_starts_every_chunk_and_document():
    from ridgefill.calibration import special_prefix
    from ridgefill.evaluate.documents import evaluation_documents

    assert special_prefix(CharTokenizer()) == [] and special_prefix(BosCharTokenizer()) == [0]
    text = "".join("abcd"[(i * 7) % 4] + "abcd"[i % 4] for i in range(500))  # ids 97..100, never 0
    ids = torch.tensor(CharTokenizer()(text)["input_ids"])
    plain = calibration_chunks(CharTokenizer(), [text], 256, 64)
    bos = calibration_chunks(BosCharTokenizer(), [text], 256, 64)
    assert all(c.shape == (64,) for c in plain + bos)  # chunks keep their length
    assert all(int(c[0]) == 0 for c in bos) and not any(int(c[0]) == 0 for c in plain)
    assert torch.equal(bos[0][1:], ids[:63]) and torch.equal(plain[0], ids[:64])  # then consecutive text
    docs = evaluation_documents(BosCharTokenizer(), {"t": text}, 2, 100)
    assert [tuple(d.shape) for d in docs] == [(101,), (101,)]
    assert all(int(d[0]) == 0 for d in docs) and torch.equal(docs[0][1:], ids[:100])
    assert torch.equal(evaluation_documents(CharTokenizer(), {"t": text}, 2, 100)[0], ids[:101])


def test_atomic_write_gives_usual_permissions_and_keeps_the_old_file_on_failure(tmp_path):
    import os

    from ridgefill.fileio import atomic_write, write_json

    path = write_json(tmp_path / "r.json", {"a": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == 0o666 & ~umask
    with pytest.raises(RuntimeError):
        atomic_write(path, lambda tmp: (open(tmp, "w").write("half"), (_ for _ in ()).throw(RuntimeError("x"))))
    assert path.read_text() == '{\n  "a": 1\n}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_attach_stats_gives_old_maps_their_means(tmp_path, maps):
    """Maps files written before the calibration means were stored take them from their statistics."""
    from ridgefill.maps import attach_stats

    path = tmp_path / "m.safetensors"
    old = RidgeMaps(maps.split, maps.weights, maps.biases, maps.lambdas, dict(maps.meta), maps.stats)
    old.save(path)  # no means in the file
    back = load_maps(path)
    assert back.mean_h is None
    attach_stats(back, path)
    mean_h, mean_x = maps.stats.means()
    assert torch.equal(back.mean_h, mean_h.float()) and torch.equal(back.mean_x, mean_x.float())
    assert torch.equal(back.centred_biases(), maps.centred_biases())
    assert back.cov_h is not None and torch.equal(back.cov_h, maps.cov_h)
    other = RidgeMaps(maps.split, maps.weights * 2, maps.biases, maps.lambdas, dict(maps.meta))
    with pytest.raises(MapsFormatError, match="belongs to other maps"):
        attach_stats(other, path)


def test_maps_store_the_calibration_covariance(tmp_path, maps):
    """``cov_h`` (query-agnostic selection) is the covariance of the calibration ``h_S`` rows, saved and
    loaded with the maps; a file with a wrongly shaped one is refused."""
    from safetensors.torch import load_file, save_file

    from ridgefill.maps import calibration_cov

    st = maps.stats
    d = maps.weights.shape[1]
    assert maps.cov_h.shape == (d, d)
    assert torch.allclose(maps.cov_h.double(), calibration_cov(st), atol=1e-6)
    mean_h, _ = st.means()
    # the streaming covariance equals Σ (h − h̄)(h − h̄)ᵀ / n computed from the shifted sums directly
    ph = mean_h - st.shift_h
    direct = (st.gram - st.count * torch.outer(ph, ph)) / st.count
    assert torch.allclose(calibration_cov(st), direct, atol=1e-9)
    assert bool((torch.linalg.eigvalsh(maps.cov_h.double()) > -1e-6).all())  # a covariance: PSD
    path = maps.save(tmp_path / "m.safetensors")
    back = load_maps(path)
    assert torch.equal(back.cov_h, maps.cov_h.float())
    tensors = load_file(path)
    tensors["cov_h"] = tensors["cov_h"][:, :-1].contiguous()
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    save_file(tensors, tmp_path / "bad.safetensors", metadata=meta)
    with pytest.raises(MapsFormatError, match="calibration covariance"):
        load_maps(tmp_path / "bad.safetensors")
