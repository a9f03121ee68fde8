"""What the patched llama.cpp refuses, and how (engines/llamacpp, docs/llamacpp.md "Checks").

Checked here, each in a driver process of its own on the bundled SmolLM2 Q4_1 GGUF, with maps exported for
it by ``ridgefill export-gguf`` (context maps at S = 15 with small random values: what is checked is the
file, not the fill's accuracy):
- the maps exported for this model file load and run (exit 0), and the patched build prints no
  ``RIDGEFILL_N_PROMPT`` message at context creation (the graph reserved there is not checked) and reports
  the verified maps once;
- a NaN in a bias (with the checksum made to match it), a changed weight value (checksum not matching), maps
  exported for another model file of the same shapes (one byte of one weight changed in a copy of the GGUF),
  and maps of the old format without checksum and fingerprint: each stops the process at context creation,
  before any batch is decoded (exit status 1, no output file);
- ``RIDGEFILL_MAPS`` without ``RIDGEFILL_N_PROMPT``, and ``RIDGEFILL_N_PROMPT`` / ``RIDGEFILL_TAIL`` that are
  not whole numbers in 1..2^31-1 (an overflow, a word, 0, a negative number): each stops the process when the
  first batch is decoded (exit status 1);
- every stop prints its ``ridgefill: ...`` line exactly once, and names what to do.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engines" / "llamacpp"
GGUF_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
N = 200  # prompt tokens (ubatches of 64: the fill spans several)


def random_maps(seed: int = 0):
    """Context input maps for SmolLM2 (30 layers of width 576) at S = 15, small random values."""
    from ridgefill.maps import RidgeMaps

    g = torch.Generator().manual_seed(seed)
    layers, d = 30 - 16, 576
    return RidgeMaps(split=15, weights=0.01 * torch.randn(layers, 2 * d, d, generator=g),
                     biases=0.01 * torch.randn(layers, d, generator=g), lambdas=[1.0] * layers,
                     meta={"context": 1, "model_name": "smollm2"})


@pytest.fixture(scope="module")
def files(build, tmp_path_factory):
    """The good maps, and the damaged files: {"good", "nan", "flipped", "other_model", "old_format"}."""
    import gguf

    from ridgefill.export_gguf import export_gguf

    tmp = tmp_path_factory.mktemp("maps")
    model = build / GGUF_MODEL
    good = export_gguf(random_maps(), tmp / "good.gguf", model=model, tail=16)
    r = gguf.GGUFReader(str(good))
    tensors = {t.name: t for t in r.tensors}
    stored_sha = bytes(r.fields["ridgefill.maps_sha256"].parts[-1]).decode()
    data = bytearray(good.read_bytes())
    del r

    # a NaN in a bias, with ridgefill.maps_sha256 rewritten to match the damaged tensors: only the finiteness
    # check can refuse it
    nan = bytearray(data)
    bias = tensors["ridgefill.bias.20"]
    nan[bias.data_offset + 4 * 7:bias.data_offset + 4 * 8] = np.float32(np.nan).tobytes()
    h = hashlib.sha256()
    for layer in range(16, 30):
        for kind in ("weight", "bias"):
            t = tensors[f"ridgefill.{kind}.{layer}"]
            h.update(bytes(nan[t.data_offset:t.data_offset + int(t.n_bytes)]))
    assert nan.count(stored_sha.encode()) == 1
    nan = nan.replace(stored_sha.encode(), h.hexdigest().encode())
    (tmp / "nan.gguf").write_bytes(nan)

    # one weight value changed (finite): only the checksum can refuse it
    flipped = bytearray(data)
    w = tensors["ridgefill.weight.25"]
    flipped[w.data_offset + 4 * 1000:w.data_offset + 4 * 1001] = np.float32(0.5).tobytes()
    (tmp / "flipped.gguf").write_bytes(flipped)

    # another model of the same shapes: the bundled GGUF with one byte of blk.3.attn_q.weight changed, and maps
    # exported for it (llama.cpp runs the bundled model)
    r = gguf.GGUFReader(str(model))
    q = next(t for t in r.tensors if t.name == "blk.3.attn_q.weight")
    offset = int(q.data_offset) + 100
    del r
    other = tmp / "other-model.gguf"
    shutil.copyfile(model, other)
    with open(other, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x11]))
    export_gguf(random_maps(), tmp / "other_model.gguf", model=other, tail=16)

    # the format without checksum and fingerprint (format_version 1)
    w = gguf.GGUFWriter(str(tmp / "old_format.gguf"), "ridgefill")
    w.add_uint32("ridgefill.format_version", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"good": good, **{k: tmp / f"{k}.gguf" for k in ("nan", "flipped", "other_model", "old_format")}}


def run(build: Path, tmp: Path, env: dict, set_n_prompt: bool = True) -> subprocess.CompletedProcess:
    """One driver process on the patched build: a prompt of N tokens in ubatches of 64, 2 greedy tokens."""
    req = {"build": str(build / "ridgefill"), "model": str(build / GGUF_MODEL), "prompts": [list(range(1000, 1000 + N))],
           "n_ubatch": 64, "n_batch": 128, "gen": 2, "threads": 2, "set_n_prompt": set_n_prompt}
    (tmp / "req.json").write_text(json.dumps(req))
    (tmp / "out.npz").unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("RIDGEFILL_") and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    return subprocess.run([sys.executable, str(ENGINE / "driver.py"), str(tmp / "req.json"), str(tmp / "out.npz")],
                          env={**base, **{k: str(v) for k, v in env.items()}}, capture_output=True, text=True)


def stopped_once(proc: subprocess.CompletedProcess, tmp: Path, *needles: str) -> str:
    """The process stopped with exit status 1 and one ``ridgefill:`` error line, which holds ``needles``;
    returns that line."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert not (tmp / "out.npz").exists()
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ridgefill: ") and "verified" not in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_good_maps_run_without_false_messages(build, files, tmp_path):
    proc = run(build, tmp_path, {"RIDGEFILL_MAPS": files["good"]})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RIDGEFILL_N_PROMPT" not in proc.stderr  # no message from the graph reserved at context creation
    assert proc.stderr.count("checksum and model fingerprint verified") == 1
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("ridgefill: ") and "verified" not in ln] == []
    with np.load(tmp_path / "out.npz") as z:
        assert np.isfinite(z["logits"]).all() and z["lengths"].tolist() == [N]


@pytest.mark.parametrize("which, needles", [
    ("nan", ["holds a non-finite value (nan) in ridgefill.bias.20 at element 7", "fit them again"]),
    ("flipped", ["fails its content checksum", "export it again"]),
    ("other_model", ["was exported for another model file ('other-model.gguf'", "fit maps for this model"]),
    ("old_format", ["ridgefill.format_version 1, this build reads 2", "--model"]),
], ids=["nan_bias", "changed_weight", "other_model", "old_format"])
def test_bad_maps_stop_at_context_creation(build, files, tmp_path, which, needles):
    proc = run(build, tmp_path, {"RIDGEFILL_MAPS": files[which]})
    line = stopped_once(proc, tmp_path, str(files[which]), *needles)
    assert "llama_decode" not in proc.stderr and "prompt 0" not in proc.stdout, line


def test_missing_n_prompt_stops_when_decoding(build, files, tmp_path):
    proc = run(build, tmp_path, {"RIDGEFILL_MAPS": files["good"]}, set_n_prompt=False)
    stopped_once(proc, tmp_path, "RIDGEFILL_MAPS is set but RIDGEFILL_N_PROMPT is not",
                 "set RIDGEFILL_N_PROMPT to the prompt's length in tokens")
    assert proc.stderr.count("RIDGEFILL_N_PROMPT is not") == 1


@pytest.mark.parametrize("name, value", [("RIDGEFILL_TAIL", "99999999999"), ("RIDGEFILL_TAIL", "2147483648"),
                                         ("RIDGEFILL_TAIL", "abc"), ("RIDGEFILL_TAIL", "0"),
                                         ("RIDGEFILL_N_PROMPT", "-5"), ("RIDGEFILL_N_PROMPT", "99999999999")])
def test_bad_numbers_stop(build, files, tmp_path, name, value):
    proc = run(build, tmp_path, {"RIDGEFILL_MAPS": files["good"], "RIDGEFILL_N_PROMPT": N, name: value},
               set_n_prompt=False)
    stopped_once(proc, tmp_path, f"{name}='{value}' is not a whole number in 1..2147483647")


def test_largest_tail_runs_exactly(build, files, tmp_path):
    """RIDGEFILL_TAIL = 2^31 - 1 is accepted: every token exact, logits equal the build without maps."""
    exact = run(build, tmp_path, {})
    assert exact.returncode == 0, exact.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as z:
        want = z["logits"]
    proc = run(build, tmp_path, {"RIDGEFILL_MAPS": files["good"], "RIDGEFILL_TAIL": 2**31 - 1})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as z:
        assert np.array_equal(z["logits"], want)
