"""Evaluation and calibration on the user's own text (``--text FILE ...``), on a tiny random model saved as
a local Hugging Face directory (byte-level tokenizer): what the maps record about their calibration
text, the disjointness check (overlap refused with OverlapError) and too-short files."""

import json

import numpy as np
import pytest
import torch

from ridgefill import defaults
from ridgefill.calibration import calibrate, calibration_plan
from ridgefill.cli import main
from ridgefill.errors import InputError, MapsFormatError, OverlapError
from ridgefill.maps import load_maps
from ridgefill.data.overlap import Fingerprint, calibration_label, check_disjoint, fingerprint, sample_for, window_hashes
from ridgefill.evaluate.main_job import maps_fingerprint
from ridgefill.evaluate.documents import evaluation_plan
from ridgefill.evaluate.main_job import RunConfig, format_table, run
from evaluate_helpers import ByteTokenizer, save_byte_model

WORDS = ("harbour lantern meadow kettle falcon orchard compass violin pebble saddle window thistle anchor basket "
         "candle ribbon glacier otter bridge teapot quiet amber brisk hollow silver gentle crimson wooden frozen "
         "narrow golden bitter velvet rustic lucky sleepy proud humble distant hidden").split()


def prose(seed: int, words: int) -> str:
    """Seeded random sentences of :data:`WORDS`: two seeds share no 32-byte run in practice."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(words):
        w = WORDS[rng.integers(len(WORDS))]
        out.append(w.capitalize() if i % 9 == 0 else w)
        if i % 9 == 8:
            out[-1] += "."
    return " ".join(out) + "\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("usertext")
    model, tok = save_byte_model(root / "model", seed=7)
    (root / "calib.txt").write_text(prose(1, 400))  # ~2,700 bytes = tokens
    (root / "other.txt").write_text(prose(2, 400))
    (root / "mixed.txt").write_text(prose(3, 200) + (root / "calib.txt").read_text()[:1200])
    (root / "short.txt").write_text("Too short to hold a document.\n")
    calibrate(model, tok, {"calib.txt": (root / "calib.txt").read_text()}, split=2, tokens=1024, chunk=128,
              lam="auto", progress=False, context=0).save(root / "out" / "maps-S2.safetensors")
    return root, model, tok


def _eval(root, *args):
    """An eval command with the maps fitted on calib.txt (named: maps cached in --out are refitted when they
    were not fitted on the shipped calibration set)."""
    return main([*args, "--model", str(root / "model"), "--out", str(root / "out"), "--calib-tokens", "1024",
                 "--chunk", "128", "--quiet", "--splits", "2", "--maps", str(root / "out" / "maps-S2.safetensors")])


LOSS = ["--docs", "2", "--novel-docs", "0", "--doc-tokens", "200", "--tail", "32", "--window", "8", "--tau",
        "0.5", "--resamples", "100"]


# --------------------------------------------------------------------------------------------------
# fingerprints and what the maps record

def test_fingerprint_finds_a_shared_run_and_nothing_else():
    rng = np.random.default_rng(0)
    calib, other = rng.integers(0, 50_000, 4000), rng.integers(0, 50_000, 2000)
    fp = fingerprint([calib[:2000], calib[2000:]])
    assert fp.window == 32 and fp.sample == 32
    # about one window in 32 is kept (content-defined), never a window that crosses the two runs' edge
    assert 60 < fp.hashes.size < 200
    edge = window_hashes(calib[1990:2030])[:9]  # the 9 windows of these 40 tokens that cross token 2000
    assert not np.isin(edge, fp.hashes).any()
    check_disjoint([torch.as_tensor(other)], fp, names=["document 1"], calibration="c")  # no overlap: no error
    leaked = torch.as_tensor(np.concatenate([other[:500], calib[100:612], other[500:]]))
    with pytest.raises(OverlapError, match=r"document 2 overlaps the calibration text \(c\).*first at token 5\d\d"):
        check_disjoint([torch.as_tensor(other), leaked], fp, names=["document 1", "document 2"], calibration="c")
    assert [sample_for(n) for n in (1, 4096, 4097, 65536, 65537)] == [1, 1, 2, 16, 32]
    back = Fingerprint.from_meta(json.loads(json.dumps(fp.to_meta())))
    assert np.array_equal(back.hashes, fp.hashes) and (back.window, back.sample) == (32, 32)
    with pytest.raises(MapsFormatError, match="malformed"):
        Fingerprint.from_meta({"window": 32, "sample": 32, "hashes": ["not hex"]})


def test_calibration_plan_records_each_text():
    tok = ByteTokenizer()
    texts = {"a.txt": "x" * 1000, "b.txt": "y" * 300, "blank.txt": "   "}
    chunks, recs = calibration_plan(tok, texts, 512, 128)
    assert len(chunks) == 4
    assert [r["name"] for r in recs] == ["a.txt", "b.txt"]  # the blank text holds nothing
    assert [r["text_tokens"] for r in recs] == [1000, 300]
    assert [r["calibration_tokens"] for r in recs] == [256, 256]  # two chunks each, round-robin
    import hashlib

    assert recs[0]["sha256"] == hashlib.sha256(b"x" * 1000).hexdigest()
    assert recs[1]["sha256"] == hashlib.sha256(b"y" * 300).hexdigest() and recs[1]["characters"] == 300


def test_maps_record_their_calibration_text(work):
    root, model, tok = work
    maps = load_maps(root / "out" / "maps-S2.safetensors")
    (rec,) = maps.meta["calibration_texts"]
    text = (root / "calib.txt").read_text()
    assert rec["name"] == "calib.txt" and rec["text_tokens"] == len(text.encode())
    assert rec["calibration_tokens"] == maps.meta["calibration_tokens"] == 1024
    assert calibration_label(maps.meta).startswith(f"calib.txt (1,024 of {len(text.encode()):,} tokens, sha256 ")
    fp = maps_fingerprint(maps, tok, required=True)
    assert fp.hashes.size > 10
    old = dict(maps.meta)
    del old["calibration_fingerprint"], old["calibration_texts"]
    maps.meta = old  # a file from before maps recorded their text, fitted on user text: cannot be checked
    assert maps_fingerprint(maps, tok, required=False) is None
    with pytest.raises(OverlapError, match="refit them"):
        maps_fingerprint(maps, tok, required=True)
    assert calibration_label(old).startswith("unrecorded text (sha256 of all of it ")


def test_evaluation_plan_labels_documents_and_refuses_short_text():
    tok = ByteTokenizer()
    docs, labels = evaluation_plan(tok, {"a.txt": "a" * 500, "b.txt": "b" * 300}, 3, 99)
    assert [len(d) for d in docs] == [100, 100, 100]
    assert labels == ["document 1 ('a.txt', tokens 0-100)", "document 2 ('b.txt', tokens 0-100)",
                      "document 3 ('a.txt', tokens 400-500)"]
    # a full text is skipped while another has room: 8 documents are 5 of 'a.txt' and 3 of 'b.txt'
    docs, labels = evaluation_plan(tok, {"a.txt": "a" * 500, "b.txt": "b" * 300}, 8, 99)
    assert sum("'a.txt'" in x for x in labels) == 5 and sum("'b.txt'" in x for x in labels) == 3
    with pytest.raises(InputError, match=r"'a.txt' has 500 tokens: room for 5 documents of 100 tokens but 6 "
                                         r"were asked of it \(documents are spread round-robin"):
        evaluation_plan(tok, {"a.txt": "a" * 500, "b.txt": "b" * 300}, 9, 99)


# --------------------------------------------------------------------------------------------------
# the commands

def test_calibrate_text_records_files_and_refuses_a_short_one(work, capsys, monkeypatch):
    root, _, _ = work
    monkeypatch.setattr(defaults, "CHUNK", 128)  # the command line's calibration chunk, small for speed
    out = root / "cal" / "m.safetensors"
    assert main(["calibrate", "--model", str(root / "model"), "--split", "2", "--tokens", "512",
                 "--text", str(root / "calib.txt"), str(root / "other.txt"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"calibrated on: {root / 'calib.txt'} (256 of " in printed and str(root / "other.txt") in printed
    recs = load_maps(out).meta["calibration_texts"]
    assert [r["calibration_tokens"] for r in recs] == [256, 256]
    assert main(["calibrate", "--model", str(root / "model"), "--split", "2", "--tokens", "512",
                 "--text", str(root / "calib.txt"), str(root / "short.txt"), "--out", str(root / "cal" / "x")]) == 2
    err = capsys.readouterr().err
    assert "short.txt' has 30 tokens, fewer than one calibration chunk (128 text tokens" in err


def test_eval_loss_on_user_text_and_overlap_refused(work, capsys):
    root, _, _ = work
    assert _eval(root, "eval", "loss", "--text", str(root / "other.txt"), "--json", str(root / "l.json"), *LOSS) == 0
    rep = json.loads((root / "l.json").read_text())
    assert rep["document_sets"]["plain"]["source"] == f"text files {[str(root / 'other.txt')]}, evenly spaced"
    assert rep["document_sets"]["texts"][0]["characters"] == len((root / "other.txt").read_text())
    assert len(rep["documents"]) == 2 and {r["variant"] for r in rep["summary"]} == {"2/ridge", "2/identity", "2/none"}
    assert rep["maps"]["2"]["calibration_tokens"] == 1024  # the cached maps, not refitted
    capsys.readouterr()
    # the calibration file itself: refused, naming the document and the calibration text
    assert _eval(root, "eval", "loss", "--text", str(root / "calib.txt"), *LOSS) == 2
    err = capsys.readouterr().err
    assert "error: evaluation plain document 1 (" in err and "overlaps the calibration text (calib.txt (1,024" in err
    assert "evaluate on other text (--text)" in err
    # too short for one document: refused before anything runs
    assert _eval(root, "eval", "loss", "--text", str(root / "short.txt"), *LOSS) == 2
    assert "'" + str(root / "short.txt") + "' has 30 tokens: room for 0 documents of 201 tokens" in capsys.readouterr().err


def test_eval_needle_and_depth_on_user_text(work, capsys):
    root, _, _ = work
    needle = ["--lengths", "1500", "--trials", "1", "--variants", "single", "--modes", "exact,ridge",
              "--needle-tail", "200"]
    assert _eval(root, "eval", "needle", "--text", str(root / "other.txt"), "--json", str(root / "n.json"),
                 *needle) == 0
    rep = json.loads((root / "n.json").read_text())
    assert rep["haystack"] == f"text files {[str(root / 'other.txt')]}" and len(rep["trials"]) == 1
    capsys.readouterr()
    # a haystack that holds 1,200 characters of the calibration text is refused
    assert _eval(root, "eval", "needle", "--text", str(root / "mixed.txt"), *needle) == 2
    assert "needle haystack text '" + str(root / "mixed.txt") + "' overlaps the calibration text" in capsys.readouterr().err
    depth = ["--depths", "1/3", "--needle-length", "1500", "--needle-trials", "1", "--needle-tail", "200", *LOSS]
    main_args = ["eval", "depth", "--model", str(root / "model"), "--out", str(root / "out"), "--calib-tokens",
                 "1024", "--chunk", "128", "--quiet", "--maps", str(root / "out" / "maps-S2.safetensors")]
    assert main([*main_args, "--text", str(root / "other.txt"), "--json", str(root / "d.json"), *depth]) == 0
    rep = json.loads((root / "d.json").read_text())
    assert rep["splits"] == [2] and len(rep["loss"]["documents"]) == 2 and len(rep["needles"]["trials"]) == 1
    capsys.readouterr()
    assert main([*main_args, "--text", str(root / "calib.txt"), *depth]) == 2
    assert "overlaps the calibration text" in capsys.readouterr().err


def test_run_on_user_text_prints_the_calibration_text_and_refuses_overlap(work, capsys):
    root, _, _ = work
    maps = str(root / "out" / "maps-S2.safetensors")
    cfg = RunConfig(model=str(root / "model"), split=2, tail=32, calib_tokens=1024, chunk=128, docs=2,
                    doc_tokens=200, gen_tokens=4, repeats=1, out=str(root / "run"), maps=maps, needle_trials=0,
                    texts=(str(root / "other.txt"),))
    rep = run(cfg, progress=False)
    assert rep["evaluation_books"] == [] and rep["evaluation_texts"][0]["name"] == str(root / "other.txt")
    assert rep["calibration_texts"][0]["name"] == "calib.txt" and rep["documents"] == 2
    table = format_table(rep)
    assert "maps calibrated on: calib.txt (1,024 of " in table and f"evaluated on: {root / 'other.txt'}" in table
    assert rep["modes"]["exact"]["delta_nll"] == 0 and rep["scored_tokens_per_mode"] == 64
    with pytest.raises(OverlapError) as refused:
        run(RunConfig(model=str(root / "model"), split=2, tail=32, calib_tokens=1024, chunk=128, docs=2,
                      doc_tokens=200, gen_tokens=4, repeats=1, needle_trials=0, out=str(root / "run2"), maps=maps,
                      texts=(str(root / "mixed.txt"),)), progress=False)
    err = str(refused.value)
    # the second document, the file's last 201 tokens, holds calibration text (the first does not)
    assert "evaluation document 2 (" in err and "overlaps the calibration text (calib.txt" in err


def test_eval_loss_with_a_maps_file(work, capsys):
    root, model, tok = work
    path = root / "own" / "maps-other.safetensors"
    calibrate(model, tok, {"other.txt": (root / "other.txt").read_text()}, split=2, tokens=512, chunk=128,
              lam="auto", progress=False, context=0).save(path)
    args = ["--model", str(root / "model"), "--out", str(root / "own"), "--quiet", "--maps", str(path), *LOSS]
    assert main(["eval", "loss", "--splits", "2", "--text", str(root / "calib.txt"), *args]) == 0
    rep = json.loads((root / "own" / "loss.json").read_text())
    assert rep["maps"]["2"]["calibration_tokens"] == 512
    assert rep["maps"]["2"]["calibrated_on"].startswith("other.txt (512 of ")
    assert not (root / "own" / "maps-S2.safetensors").exists()  # the given file, nothing fitted
    capsys.readouterr()
    assert main(["eval", "loss", "--splits", "2", "--text", str(root / "other.txt"), *args]) == 2
    assert "overlaps the calibration text (other.txt (512 of" in capsys.readouterr().err
    assert main(["eval", "loss", "--splits", "3", "--text", str(root / "calib.txt"), *args]) == 2
    assert "is fitted at split S=2, but the splits asked are [3]; pass --splits 2" in capsys.readouterr().err


def test_old_maps_fitted_on_the_bundled_novels_are_checked_by_rebuilding_their_chunks():
    from ridgefill.data.texts import CALIBRATION_BOOKS, EVALUATION_BOOKS, load_texts
    from ridgefill.data.texts import text_hash
    from ridgefill.maps import RidgeMaps

    books = load_texts()
    tok = ByteTokenizer()
    meta = {"text_sha256": text_hash([books[k] for k in CALIBRATION_BOOKS]), "calibration_tokens": 512, "chunk": 128}
    old = RidgeMaps(2, torch.zeros(3, 4, 4), torch.zeros(3, 4), [1.0] * 3, meta)  # no recorded fingerprint
    assert maps_fingerprint(old, tok, required=False) is None  # bundled evaluation novels: nothing to check
    fp = maps_fingerprint(old, tok, required=True)
    assert fp.sample == 1 and fp.hashes.size == 4 * (128 - 32 + 1)  # one chunk per book, every window
    first = torch.tensor(list(books[CALIBRATION_BOOKS[0]].encode()[:200]))  # the first book's first chunk
    with pytest.raises(OverlapError, match="first at token 0"):
        check_disjoint([first], fp, names=["document 1"], calibration="the novels")
    check_disjoint([torch.tensor(list(books[EVALUATION_BOOKS[0]].encode()[:2000]))], fp, names=["d"],
                   calibration="the novels")
