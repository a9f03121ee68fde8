"""Files a user can trust: content hashes in maps, statistics and checkpoints; no finished work lost to a
full disk; checkpoints that know their origin; padded batches refused; badly scaled ridge solves; the
command line's checks before the model loads; a Hypothesis fuzz of the three readers.

A full disk is simulated: the write of a file's bytes (``ridgefill.fileio._write_bytes``) raises
``OSError(ENOSPC)`` part way, or the free space the writer reads (``ridgefill.fileio._free``) is set small;
mounting a small tmpfs needs root.
"""

from __future__ import annotations

import errno
import json
import struct
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import ridgefill.checkpoint as checkpoint_module
import ridgefill.fileio as fileio
from conftest import tiny_llama
from ridgefill import RidgeMaps, load_maps, prefill
from ridgefill.calibration import calibrate
from ridgefill.checkpoint import checkpoint_path, load_checkpoint
from ridgefill.errors import InputError, MapsFormatError, UnverifiedFileWarning, WriteError
from ridgefill.integrity import KEY
from ridgefill.maps import load_stats, stats_path
from ridgefill.ridge import solve_ridge

S = 2


class CharTokenizer:
    """One token per byte, modulo the vocabulary."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [b % 101 for b in text.encode()]}


TEXT = "It was a bright cold day in April, and the clocks were striking thirteen. " * 40
CAL = dict(split=S, tokens=1024, chunk=128, lam="auto", model_name="tiny", progress=False, context=0)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=7)


@pytest.fixture(scope="module")
def maps(model):
    return calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], **CAL)


def _offsets(path: Path) -> dict[str, tuple[int, int]]:
    """Byte range of every tensor's data in a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items()
            if k != "__metadata__"}


def _flip(path: Path, tensor: str, at: float = 0.5) -> None:
    """Flip one bit in the middle of ``tensor``'s bytes (a float's low mantissa bit: a finite value)."""
    lo, hi = _offsets(path)[tensor]
    data = bytearray(path.read_bytes())
    data[lo + int((hi - lo) * at) // 8 * 8] ^= 0x01
    path.write_bytes(bytes(data))


def _rewrite(path: Path, key: str, edit) -> None:
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()[key])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(path), metadata={key: json.dumps(edit(meta))})


# ------------------------------------------------------------------------------------------------
# 1. self-verifying files
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tensor", ["weights", "biases", "mean_h", "mean_x", "cov_h"])
def test_a_maps_file_alone_with_a_flipped_tensor_byte_is_refused(tmp_path, maps, tensor):
    path = maps.save(tmp_path / "m.safetensors")
    stats_path(path).unlink()  # the maps file copied alone
    _flip(path, tensor)
    with pytest.raises(MapsFormatError, match=f"m.safetensors' is corrupted: tensor {tensor} differs from its SHA-256"):
        load_maps(path)


@pytest.mark.parametrize("field, value", [("lambdas", "scaled"), ("split", 1), ("context_penalty", 4.0),
                                          ("context", 1)])
def test_a_maps_header_edit_that_changes_results_is_refused(tmp_path, maps, field, value):
    path = maps.save(tmp_path / "m.safetensors")
    if field == "lambdas":
        value = [v * 1.5 for v in maps.lambdas]
    _rewrite(path, "ridgefill", lambda m: {**m, field: value})
    with pytest.raises(MapsFormatError, match="corrupted: its header fields .*differ|context_penalty|inconsistent"):
        load_maps(path)


def test_a_header_lambda_edit_is_named_as_corruption(tmp_path, maps):
    path = maps.save(tmp_path / "m.safetensors")
    _rewrite(path, "ridgefill", lambda m: {**m, "lambdas": [v * 1.5 for v in m["lambdas"]]})
    with pytest.raises(MapsFormatError, match=r"is corrupted: its header fields \(context, context_penalty, "
                                              r"format_version, kind, lambdas, select, split\) differ"):
        load_maps(path)


@pytest.mark.parametrize("tensor", ["gram", "cross", "shift_h"])
def test_a_statistics_tensor_flip_is_refused(tmp_path, maps, tensor):
    path = stats_path(maps.save(tmp_path / "m.safetensors"))
    _flip(path, tensor)
    with pytest.raises(MapsFormatError, match=f"statistics file .* is corrupted: tensor {tensor} differs"):
        load_stats(path)
    _rewrite(path, "ridgefill_stats", lambda m: m)  # the flip stays: still refused after a rewrite of the header
    with pytest.raises(MapsFormatError, match=f"tensor {tensor} differs"):
        load_stats(path)


def test_files_without_hashes_load_with_a_warning(tmp_path, maps):
    path = maps.save(tmp_path / "m.safetensors")
    for p, key in ((path, "ridgefill"), (stats_path(path), "ridgefill_stats")):
        _rewrite(p, key, lambda m: {k: v for k, v in m.items() if k != KEY})  # as written before hashes
    with pytest.warns(UnverifiedFileWarning, match="carries no content hashes .* used unverified; refit it"):
        old = load_maps(path)
    assert torch.equal(old.weights, maps.weights) and old.lambdas == maps.lambdas
    with pytest.warns(UnverifiedFileWarning, match="statistics file"):
        stats, _ = load_stats(stats_path(path))
    assert torch.equal(stats.gram, maps.stats.gram)
    old.save(tmp_path / "again.safetensors")  # saving again adds the hashes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_maps(tmp_path / "again.safetensors")


def test_a_verified_load_keeps_every_value(tmp_path, maps):
    path = maps.save(tmp_path / "m.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = load_maps(path)
    for k in ("weights", "biases", "mean_h", "mean_x", "cov_h"):
        assert torch.equal(getattr(back, k), getattr(maps, k).float()), k
    assert KEY not in back.meta and back.meta["solve_method"] == ["cholesky"] * len(maps.lambdas)


# ------------------------------------------------------------------------------------------------
# 2. no finished work lost
# ------------------------------------------------------------------------------------------------

def _full_disk(only: str | None = None):
    """A ``_write_bytes`` that fails with ENOSPC after 100 bytes (for files whose name holds ``only``)."""
    real = fileio._write_bytes

    def write(fh, data):
        if only is None or only in Path(fh.name).name:
            fh.write(data[:100])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fh, data)

    return write


def test_a_full_disk_raises_a_typed_error_with_the_bytes_needed(tmp_path, maps, monkeypatch):
    path = maps.save(tmp_path / "m.safetensors")
    before = path.read_bytes(), stats_path(path).read_bytes()
    monkeypatch.setattr(fileio, "_write_bytes", _full_disk())
    with pytest.raises(WriteError, match=r"cannot write .*m.stats.safetensors' \(no space left on device\): the write "
                                         r"needs [0-9,]+ bytes in its folder .*, which has [0-9,]+ bytes free") as info:
        maps.save(path)
    assert info.value.needed == len(before[1]) + len(before[0])  # the pair's bytes, both in this folder
    assert (path.read_bytes(), stats_path(path).read_bytes()) == before  # the old pair, whole
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_too_little_room_is_refused_before_anything_is_written(tmp_path, maps, monkeypatch):
    monkeypatch.setattr(fileio, "_free", lambda folder: 1000)
    monkeypatch.setattr(fileio, "_write_bytes", lambda fh, data: pytest.fail("nothing may be written"))
    with pytest.raises(WriteError, match="needs [0-9,]+ bytes in its folder .*, which has 1,000 bytes free"):
        maps.save(tmp_path / "m.safetensors")
    with pytest.raises(WriteError, match="report.json"):
        fileio.write_json(tmp_path / "report.json", {"rows": list(range(1000))})
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing, not even the pair's lock file


def test_a_failed_checkpoint_write_keeps_the_finished_pass(tmp_path, model, maps, monkeypatch, capsys):
    ckpt = checkpoint_path(tmp_path / "m.safetensors")
    monkeypatch.setattr(fileio, "_write_bytes", _full_disk(only="checkpoint"))
    got = calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], checkpoint=ckpt, **CAL)
    assert "warning: the calibration checkpoint was not written, the pass goes on" in capsys.readouterr().err
    assert not ckpt.exists()
    assert torch.equal(got.weights, maps.weights) and torch.equal(got.stats.gram, maps.stats.gram)
    got.save(tmp_path / "m.safetensors")  # the maps and statistics are still written
    assert torch.equal(load_maps(tmp_path / "m.safetensors").weights, maps.weights)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    from evaluate_helpers import save_byte_model

    root = tmp_path_factory.mktemp("bytemodel")
    save_byte_model(root / "model", seed=7)
    (root / "calib.txt").write_text(TEXT)
    (root / "p.txt").write_text("It is a truth universally acknowledged.")
    return root


def test_cli_calibrate_on_a_full_disk(byte_model, tmp_path, monkeypatch, capsys):
    from ridgefill import defaults
    from ridgefill.cli import main

    monkeypatch.setattr(defaults, "CHUNK", 128)
    args = ["calibrate", "--model", str(byte_model / "model"), "--split", "2", "--tokens", "1024", "--context", "0",
            "--text", str(byte_model / "calib.txt")]
    monkeypatch.setattr(fileio, "_write_bytes", _full_disk(only="checkpoint"))
    out = tmp_path / "a.safetensors"
    assert main([*args, "--out", str(out)]) == 0  # the checkpoint failed; the maps were written
    assert load_maps(out).split == 2 and stats_path(out).exists()
    assert "the calibration checkpoint was not written" in capsys.readouterr().err
    monkeypatch.setattr(fileio, "_write_bytes", _full_disk())
    assert main([*args, "--out", str(tmp_path / "b.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot write") and "no space left on device" in err[-1]
    assert sum(line.startswith("error:") for line in err) == 1 and "Traceback" not in "\n".join(err)


# ------------------------------------------------------------------------------------------------
# 3. checkpoints that know their origin
# ------------------------------------------------------------------------------------------------

CKPT = dict(split=1, tokens=2048, chunk=128, lam="auto", model_name="tiny", progress=False, context=0)


def test_a_checkpoint_from_other_code_is_refused(tmp_path, model, monkeypatch):
    ckpt = tmp_path / "c.checkpoint.safetensors"
    texts = [TEXT, TEXT[::-1]]
    calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, checkpoint_every=4, **CKPT)
    with safe_open(str(ckpt), framework="pt") as f:
        meta = json.loads(f.metadata()["ridgefill_checkpoint"])
    real = checkpoint_module.origin()
    assert meta["origin"] == real and set(real) == {"ridgefill", "transformers", "torch", "code_sha256"}
    for key, value in (("torch", "0.0.1"), ("code_sha256", "0" * 64), ("transformers", "1.0")):
        monkeypatch.setattr(checkpoint_module, "origin", lambda key=key, value=value: {**real, key: value})
        with pytest.raises(InputError, match=rf"written by other code \({key}: .* in the checkpoint, .* now\).*mix "
                                             r"sums from two versions; delete .* to start the calibration over"):
            calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, **CKPT)
    monkeypatch.setattr(checkpoint_module, "origin", lambda: real)
    _rewrite(ckpt, "ridgefill_checkpoint", lambda m: {k: v for k, v in m.items() if k != "origin"})
    with pytest.raises(InputError, match="records no origin"):
        calibrate(model, CharTokenizer(), texts, checkpoint=ckpt, **CKPT)


def test_the_code_digest_follows_the_statistics_code():
    from ridgefill.checkpoint import STATS_CODE, code_digest

    assert len(code_digest()) == 64 and code_digest() == code_digest()
    assert "calibration.py" in STATS_CODE and "adapters" in STATS_CODE


def test_a_flipped_checkpoint_tensor_is_refused(tmp_path, model):
    ckpt = tmp_path / "c.checkpoint.safetensors"
    calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], checkpoint=ckpt, checkpoint_every=4, **CKPT)
    _flip(ckpt, "1.fit.gram")
    with pytest.raises(MapsFormatError, match="calibration checkpoint .* is corrupted: tensor 1.fit.gram differs"):
        calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], checkpoint=ckpt, **CKPT)


# ------------------------------------------------------------------------------------------------
# 4. padded batches are refused
# ------------------------------------------------------------------------------------------------

def test_padded_batches_on_a_hybrid_model_are_refused():
    from test_hybrid import N, VOCAB, build

    model = build("qwen3_5_text")
    pad = model.config.pad_token_id
    ids = torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))
    right, left = ids.clone(), ids.clone()
    right[1, -8:] = pad
    left[1, :8] = pad
    for batch, side in ((right, "end"), (left, "start")):
        for mode in ("identity", "exact"):
            with pytest.raises(InputError, match=rf"looks padded: row\(s\) \[1\] {side} with the pad token {pad}.*"
                                                 "one at a time"):
                prefill(model, batch, None, tail=8, mode=mode, split=1, select="off")
    mask = torch.ones_like(ids)
    mask[1, -8:] = 0
    with pytest.raises(InputError, match=r"attention_mask masks 8 position\(s\) in row\(s\) \[1\]"):
        prefill(model, ids, None, tail=8, mode="identity", split=1, select="off", attention_mask=mask)
    # an unpadded batch, and an all-ones mask, prefill as before
    a = prefill(model, ids, None, tail=8, mode="identity", split=1, select="off")
    b = prefill(model, ids, None, tail=8, mode="identity", split=1, select="off", attention_mask=torch.ones_like(ids))
    assert torch.equal(a.logits, b.logits)


# ------------------------------------------------------------------------------------------------
# 5. badly scaled ridge solves, certificate size, command-line checks
# ------------------------------------------------------------------------------------------------

def test_solve_ridge_handles_an_outlier_scaled_dimension():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 4, generator=g, dtype=torch.float64)
    h[:, 0] *= 1e9  # one dimension on another scale
    h = h - h.mean(0)
    x = h @ torch.randn(4, 4, generator=g, dtype=torch.float64) + 0.1 * torch.randn(50, 4, generator=g, dtype=torch.float64)
    gram, cross, lam = h.T @ h, h.T @ x, 0.01
    w, method = solve_ridge(gram, cross, lam, return_method=True)
    assert method == "equilibrated cholesky"
    a, rhs = gram + lam * torch.eye(4, dtype=torch.float64), cross + lam * torch.eye(4, dtype=torch.float64)
    ref = torch.linalg.solve(a, rhs)  # pivoted LU, for comparison
    torch.testing.assert_close(w, ref, rtol=1e-7, atol=0)
    assert float((a @ w - rhs).norm() / rhs.norm()) < 1e-12
    assert solve_ridge(torch.eye(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64), 1.0,
                       return_method=True)[1] == "cholesky"


def test_solve_ridge_eigen_fallback():
    # a Gram singular to working precision (rank 1) with λ far below its scale: positive definite, solvable
    v = torch.tensor([[1.0], [1.0], [1.0]], dtype=torch.float64)
    gram, cross, lam = 1e18 * (v @ v.T), torch.eye(3, dtype=torch.float64), 1e-3
    w, method = solve_ridge(gram, cross, lam, return_method=True)
    assert method in ("equilibrated cholesky", "eigen")
    a = gram + lam * torch.eye(3, dtype=torch.float64)
    rhs = cross + lam * torch.eye(3, dtype=torch.float64)
    assert float((a @ w - rhs).norm() / (a.norm() * w.norm())) < 1e-12


def test_exported_certificates_have_a_size_limit(tmp_path):
    from fractions import Fraction

    from ridgefill.certify import MAX_INSTANCE_ENTRIES, CertificateError, export_lean_certificate, solved_instance

    small = solved_instance("small", [[1, 0], [0, 2], [1, 1]], [[1, 0], [0, 1], [1, 1]], Fraction(1, 2))
    export_lean_certificate([small], tmp_path / "ok.lean")
    with pytest.raises(CertificateError, match="the Lean certificate would be [0-9,]+ bytes, more than the limit of 100"):
        export_lean_certificate([small], tmp_path / "small-limit.lean", max_bytes=100)
    d = 24
    big = solved_instance("big", [[int(i == j) for j in range(d)] for i in range(d)],
                          [[int(i == j) for j in range(d)] for i in range(d)], Fraction(1))
    with pytest.raises(CertificateError, match=f"instance big holds {4 * d * d} matrix entries, more than the "
                                               f"{MAX_INSTANCE_ENTRIES}"):
        export_lean_certificate([big], tmp_path / "big.lean")
    assert not (tmp_path / "big.lean").exists() and not (tmp_path / "small-limit.lean").exists()


def test_cli_generate_prints_the_selection_it_ran(byte_model, tmp_path, monkeypatch, capsys):
    """``ridgefill generate`` names the selection ``auto`` resolved to (the maps record none: one pass)."""
    from ridgefill import defaults
    from ridgefill.cli import main

    monkeypatch.setattr(defaults, "CHUNK", 128)
    path = tmp_path / "m.safetensors"
    assert main(["calibrate", "--model", str(byte_model / "model"), "--split", "2", "--tokens", "1024", "--context",
                 "0", "--text", str(byte_model / "calib.txt"), "--out", str(path)]) == 0
    capsys.readouterr()
    args = ["generate", "--model", str(byte_model / "model"), "--prompt-file", str(byte_model / "p.txt"),
            "--maps", str(path), "--tail", "8", "--max-new-tokens", "2"]
    for select, shown in ((None, "one-pass"), ("off", "off"), ("two-pass", "two-pass")):
        assert main(args + ([] if select is None else ["--select", select])) == 0
        err = capsys.readouterr().err
        assert f"chosen by selection {shown})" in err, err


@pytest.fixture
def no_model(monkeypatch):
    import ridgefill.data.models as models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(models, "load_model", refuse)


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1, err
    return err


def test_cli_checks_before_the_model_loads(byte_model, tmp_path, maps, no_model, monkeypatch, capsys):
    from ridgefill.cli import main

    model_dir = str(byte_model / "model")
    prompt = str(byte_model / "p.txt")
    path = maps.save(tmp_path / "m.safetensors")
    assert main(["generate", "--model", model_dir, "--prompt-file", prompt, "--maps", str(path), "--tail",
                 "100000"]) == 2
    assert "--tail is 100000: the fill needs a prompt longer than the tail" in _one_error(capsys)
    assert main(["generate", "--model", model_dir, "--prompt-file", prompt, "--maps", str(tmp_path)]) == 2
    assert f"maps file {str(tmp_path)!r} is a folder, not a file" in _one_error(capsys)
    assert main(["run", "--model", model_dir, "--maps", str(tmp_path / "missing.safetensors"), "--out",
                 str(tmp_path / "out")]) == 2
    assert "missing.safetensors' does not exist: fit it with `ridgefill calibrate --out" in _one_error(capsys)
    assert not (tmp_path / "missing.safetensors").exists() and not (tmp_path / "out").exists()
    assert main(["run", "--model", model_dir, "--maps", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "is a folder" in _one_error(capsys)
    import ridgefill.data.models as models

    monkeypatch.setattr(models, "load_tokenizer", lambda *a, **k: pytest.fail("the tokenizer loaded first"))
    assert main(["calibrate", "--model", model_dir, "--text", str(tmp_path / "nope.txt"), "--out",
                 str(tmp_path / "c.safetensors")]) == 2
    assert "text file" in _one_error(capsys)


def test_a_held_out_error_never_prints_as_minus_zero():
    from ridgefill.cli import fixed3

    assert [fixed3(v) for v in (-1e-5, -0.0, 0.0, 0.1234, -0.25, 1.0)] == ["0.000", "0.000", "0.000", "0.123",
                                                                          "-0.250", "1.000"]


# ------------------------------------------------------------------------------------------------
# 6. fuzz: every mutated file is a typed error or a verified load of the original values
# ------------------------------------------------------------------------------------------------

_FILES: dict = {}


def _originals(tmp_path_factory):
    """A maps file, its statistics and a checkpoint, written once for the fuzz."""
    if not _FILES:
        root = tmp_path_factory.mktemp("fuzz")
        model = tiny_llama(seed=7, layers=4, hidden=16)
        ckpt = root / "c.checkpoint.safetensors"
        m = calibrate(model, CharTokenizer(), [TEXT, TEXT[::-1]], checkpoint=ckpt, checkpoint_every=2,
                      **{**CAL, "split": 1, "tokens": 512})
        path = m.save(root / "m.safetensors")
        _FILES.update(maps=path.read_bytes(), stats=stats_path(path).read_bytes(), checkpoint=ckpt.read_bytes(),
                      model=model, settings=None)
        _FILES["expect"] = {"maps": load_maps(path), "stats": load_stats(stats_path(path)),
                            "checkpoint": ckpt}
    return _FILES


def _mutate(data: bytes, draw) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    kind = draw(st.sampled_from(["flip", "truncate", "header", "metadata"]))
    d = bytearray(data)
    if kind == "truncate":
        return bytes(d[:draw(st.integers(0, len(d) - 1))])
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(d) - 1))
            d[i] ^= draw(st.integers(1, 255))
        return bytes(d)
    if kind == "header":  # bytes of the JSON header: names, dtypes, shapes, offsets, metadata
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(8, 8 + n - 1))
            d[i] = draw(st.integers(0, 255))
        return bytes(d)
    header = json.loads(data[8:8 + n])  # a metadata edit: one key of the JSON object set, changed or removed
    key = next(k for k in header["__metadata__"])
    meta = json.loads(header["__metadata__"][key])
    field = draw(st.sampled_from(sorted(meta)))
    value = draw(st.one_of(st.none(), st.booleans(), st.integers(-2, 2 ** 40), st.floats(allow_nan=True),
                           st.text(max_size=4), st.just([]), st.just({}),
                           st.builds(lambda v: v if not isinstance(v, list) else [x * 2 for x in v if isinstance(x, float)],
                                     st.just(meta[field]))))
    if draw(st.booleans()):
        meta.pop(field)
    else:
        meta[field] = value
    header["__metadata__"][key] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


def _same_maps(a: RidgeMaps, b: RidgeMaps) -> None:
    for k in ("weights", "biases", "mean_h", "mean_x", "cov_h"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert (a.split, a.lambdas, a.kind, a.context, a.context_penalty) == (b.split, b.lambdas, b.kind, b.context,
                                                                         b.context_penalty)


def _same_stats(a, b) -> None:
    for k in ("shift_h", "shift_x", "sum_h", "gram", "sum_x", "cross", "sq_x"):
        assert torch.equal(getattr(a[0], k), getattr(b[0], k)), k
    assert (a[0].count, a[0].layers, a[0].hidden, a[0].outputs, a[0].context) == (
        b[0].count, b[0].layers, b[0].hidden, b[0].outputs, b[0].context)
    assert a[1].get("maps_sha256") == b[1].get("maps_sha256")


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(which=st.sampled_from(["maps", "stats", "checkpoint"]), data=st.data())
def test_fuzz_readers_give_a_typed_error_or_the_original_values(tmp_path_factory, which, data):
    files = _originals(tmp_path_factory)
    blob = _mutate(files[which], data.draw)
    target = tmp_path_factory.getbasetemp() / f"fuzz-{which}.safetensors"
    target.write_bytes(blob)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if which == "maps":
                got = load_maps(target)
            elif which == "stats":
                got = load_stats(target)
            else:
                want = load_checkpoint(files["expect"]["checkpoint"], _ckpt_settings(files), _ckpt_shapes(files))
                got = load_checkpoint(target, _ckpt_settings(files), _ckpt_shapes(files))
        except (MapsFormatError, InputError) as e:
            event(f"{which}: {type(e).__name__}")
            return  # a typed error
    unverified = any(issubclass(w.category, UnverifiedFileWarning) for w in caught)
    event(f"{which}: {'loaded with UnverifiedFileWarning' if unverified else 'verified load'}")
    if unverified:  # the hashes were removed by the edit: loaded with a warning, said out loud
        return
    if which == "maps":
        _same_maps(got, files["expect"]["maps"])
    elif which == "stats":
        _same_stats(got, files["expect"]["stats"])
    else:
        assert got[0] == want[0]
        for split in want[1]:
            for a, b in zip(got[1][split], want[1][split]):
                _same_stats((a, {}), (b, {}))


def _ckpt_meta(files) -> dict:
    with safe_open(str(files["expect"]["checkpoint"]), framework="pt") as f:
        return json.loads(f.metadata()["ridgefill_checkpoint"])


def _ckpt_settings(files) -> dict:
    return _ckpt_meta(files)["settings"]


def _ckpt_shapes(files) -> dict:
    model = files["model"]
    L, d = model.config.num_hidden_layers, model.config.hidden_size
    return {s: (L - s - 1, d, d, "inputs", 0) for s in _ckpt_settings(files)["splits"]}
