"""The shipped calibration sets (``ridgefill.data.texts.calibration_texts``): the technical texts shipped for
the default ``"mix"``, their disjointness from evaluation text, the mix's chunk shares, ``--calib-set``,
the maps reuse that depends on the calibration text, and the overlap refusal with mix maps. Commands run
on a tiny random model saved as a local Hugging Face directory (byte-level tokenizer)."""

import hashlib
import json
import re
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import script_module
from ridgefill import defaults
from ridgefill.data import models, texts as shipped
from ridgefill.calibration import calibrate, calibration_plan
from ridgefill.data.texts import text_hash
from ridgefill.cli import main
from ridgefill.errors import InputError, OverlapError
from ridgefill.maps import RidgeMaps, load_maps
from ridgefill.data.overlap import calibration_label, check_disjoint, fingerprint
from ridgefill.evaluate.main_job import maps_fingerprint
from ridgefill.evaluate.documents import evaluation_plan
from ridgefill.evaluate.main_job import RunConfig, calibration_mismatch, check_evaluation_text, run
from evaluate_helpers import ByteTokenizer, save_byte_model

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "python" / "ridgefill" / "data"
#: SHA-256 of the shipped texts (UTF-8): the same texts as the cross-domain measurement's novels-calib,
#: docs-calib and code-calib files (docs/evaluate.md, "Cross-domain maps").
SHA = {"novels": "29b270d805fabfc98c9e4f79a642526bc57c74052fc43ea658e17bffef4af0ea",
       "handbook": "852a776a4c915cd9fbc4858e3a4a9a768794f963e02337ebbba69edc8d5b8acf",
       "stdlib": "1784da90889527e838f2fd1bd7b126a4ce6093d5f68aa8864bad3997e9d07623"}
CODE_EVAL = ("configparser.py", "fractions.py", "pprint.py", "statistics.py", "calendar.py", "gettext.py")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _word_ids(texts: dict[str, str]) -> dict[str, np.ndarray]:
    """Each text as ids of its whitespace-separated words (one vocabulary for all), for window checks."""
    vocab: dict[str, int] = {}
    return {k: np.array([vocab.setdefault(w, len(vocab)) for w in re.findall(r"\S+", t)], dtype=np.int64)
            for k, t in texts.items()}


# --------------------------------------------------------------------------------------------------
# the shipped files

def test_shipped_technical_texts_load_with_their_provenance():
    texts = shipped.load_technical_texts()
    assert list(texts) == ["handbook", "stdlib"]
    assert {k: _sha(t) for k, t in texts.items()} == {k: SHA[k] for k in ("handbook", "stdlib")}
    assert len(texts["handbook"]) == 1_140_593 and len(texts["stdlib"]) == 822_748
    assert texts["handbook"].startswith("Chapter 12. Advanced Administration\n\n")
    assert texts["stdlib"].startswith("# file: argparse.py\n")
    headers = re.findall(r"^# file: (\S+)$", texts["stdlib"], flags=re.M)
    assert headers == ["argparse.py", "dataclasses.py", "difflib.py", "functools.py", "inspect.py", "pathlib.py",
                       "shutil.py", "subprocess.py", "tarfile.py", "typing.py"]
    info = shipped.technical_text_info("handbook")
    assert info["source"].startswith("Debian package debian-handbook 11.20220922")
    assert info["licence"].startswith("CC-BY-SA-3.0; *The Debian Administrator's Handbook*")
    assert "Raphaël Hertzog and Roland Mas" in info["licence"]
    info = shipped.technical_text_info("stdlib")
    assert info["title"] == "Python 3.11.7 standard library modules" and info["licence"].startswith("PSF-2.0; Copyright")
    with pytest.raises(models.AssetError, match="no shipped technical text 'other'"):
        shipped.technical_text_info("other")


def test_data_readme_records_the_shipped_files_and_both_scripts_own_their_part():
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for name in ("handbook.json.xz", "stdlib.json.xz", "austen.json.xz"):
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() in readme
    for k in ("handbook", "stdlib"):
        assert SHA[k] in readme
    assert "Creative Commons Attribution-ShareAlike 3.0 Unported" in readme and "PSF-2.0" in readme
    prep = script_module("prepare_calibration")
    assert readme.count(prep.README_MARKER) == 1
    # the technical part replaces only itself; a README without it gets it appended after a blank line
    assert prep._readme_with("austen part\n\n" + prep.README_MARKER + "\nold\n", prep.README_MARKER + "\nnew\n") == \
        "austen part\n\n" + prep.README_MARKER + "\nnew\n"
    assert prep._readme_with("austen part\n", "S\n") == "austen part\n\nS\n"
    record = {"name": "stdlib", "text": "x = 1\n", "title": "t", "source": "s", "licence": "l"}
    assert prep.encode(record) == prep.encode(dict(reversed(record.items())))  # key order does not matter


def test_shipped_calibration_text_is_disjoint_from_evaluation_text():
    """No 32-word run of any calibration text of either set appears in the evaluation novels or in the
    cross-domain code evaluation modules (the interpreter's own sources; the Debian Reference is not
    shipped and is checked by scripts/cross_domain.py)."""
    books = shipped.load_texts()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    evaluation = {k: books[k] for k in shipped.EVALUATION_BOOKS}
    evaluation.update({m: (stdlib / m).read_text(encoding="utf-8") for m in CODE_EVAL})
    calib = {**shipped.calibration_texts("mix"), **shipped.calibration_texts("novels")}
    ids = _word_ids({**{f"calib {k}": t for k, t in calib.items()}, **{f"eval {k}": t for k, t in evaluation.items()}})
    fp = fingerprint([v for k, v in ids.items() if k.startswith("calib ")], sample=1)
    assert fp.hashes.size == 814_836  # every 32-word window of the novels, the handbook and the stdlib text
    names = [k for k in ids if k.startswith("eval ")]
    check_disjoint([torch.from_numpy(ids[k]) for k in names], fp, names=names, calibration="the shipped sets")
    assert not any(f"# file: {m}" in calib["stdlib"] for m in CODE_EVAL)
    # the check does find shared runs: a window of the handbook inside an evaluation text is refused
    planted = np.concatenate([ids["eval Persuasion"][:100], ids["calib handbook"][5000:5040]])
    with pytest.raises(OverlapError, match="9 of its 32-token windows were seen in calibration, the first at token 100"):
        check_disjoint([torch.from_numpy(planted)], fp, names=["planted"], calibration="the shipped sets")


# --------------------------------------------------------------------------------------------------
# the sets

def test_calibration_sets_and_the_mix_gives_each_domain_a_third_of_the_chunks():
    mix, novels = shipped.calibration_texts(), shipped.calibration_texts("novels")
    assert shipped.DEFAULT_CALIBRATION_SET == "mix" and shipped.CALIBRATION_SETS == ("mix", "novels")
    assert {k: _sha(t) for k, t in mix.items()} == SHA
    books = shipped.load_texts()
    assert mix["novels"] == "\n\n".join(books[k] for k in shipped.CALIBRATION_BOOKS)
    assert novels == {k: books[k] for k in shipped.CALIBRATION_BOOKS}
    with pytest.raises(InputError, match="unknown calibration set 'code': use one of mix, novels"):
        shipped.calibration_texts("code")
    # the default budget (65,536 tokens in chunks of 1,024): 22 / 21 / 21 chunks, interleaved
    chunks, recs = calibration_plan(ByteTokenizer(), mix, 65536, 1024)
    assert len(chunks) == 64 and [r["name"] for r in recs] == ["novels", "handbook", "stdlib"]
    assert [r["calibration_tokens"] // 1024 for r in recs] == [22, 21, 21]
    assert [r["sha256"] for r in recs] == [SHA[k] for k in ("novels", "handbook", "stdlib")]
    first = [bytes(c[:40].tolist()) for c in chunks[:3]]
    assert first[0] == mix["novels"].encode()[:40] and first[1] == mix["handbook"].encode()[:40]
    assert first[2] == mix["stdlib"].encode()[:40]
    # held-out chunks (every 8th) cover every domain: chunks 7, 15, ... are stdlib, novels, handbook, ...
    assert {(i % 3) for i in range(7, 64, 8)} == {0, 1, 2}
    # the mix32 budget of the cross-domain measurement: 11 / 11 / 10 chunks
    _, recs = calibration_plan(ByteTokenizer(), mix, 32768, 1024)
    assert [r["calibration_tokens"] // 1024 for r in recs] == [11, 11, 10]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibsets")
    model, tok = save_byte_model(root / "model", seed=11)
    return root, model, tok


@pytest.fixture
def small_chunks(monkeypatch):
    """The command line calibrates in chunks of :data:`ridgefill.defaults.CHUNK` tokens: 128 here, for speed."""
    monkeypatch.setattr(defaults, "CHUNK", 128)


def _calibrate(root, out, *extra):
    return main(["calibrate", "--model", str(root / "model"), "--split", "2", "--tokens", "1024", "--out", str(out),
                 *extra])


def _calibrate_novels(root, model, tok):
    """Maps fitted on the shipped 'novels' set (Python API; the command line calibrates on the mix or --text)."""
    maps = calibrate(model, tok, shipped.calibration_texts("novels"), split=2, tokens=1024, chunk=128, lam="auto",
                     progress=False, context=1)
    maps.save(root / "novels.safetensors")
    return maps


def test_calibrate_default_is_the_mix_and_the_novels_set_reproduces_the_old_record(work, capsys, small_chunks):
    root, model, tok = work
    assert _calibrate(root, root / "mix.safetensors") == 0
    printed = capsys.readouterr().out
    assert ("calibrated on: the shipped 'mix' set: novels 384, handbook 384, stdlib 256 tokens (4 Austen novels; "
            "The Debian Administrator's Handbook; Python 3.11.7 standard library modules)") in printed
    meta = load_maps(root / "mix.safetensors").meta
    assert [(r["name"], r["sha256"]) for r in meta["calibration_texts"]] == [(k, SHA[k]) for k in SHA]
    assert meta["text_sha256"] == text_hash(list(shipped.calibration_texts("mix").values()))
    assert shipped.calibration_set_of(meta) == "mix"

    _calibrate_novels(root, model, tok)
    got = load_maps(root / "novels.safetensors")
    assert calibration_label(got.meta).startswith("the shipped 'novels' set: Emma 256, Mansfield Park 256, Pride & "
                                                  "Prejudice 256, Sense & Sensibility 256 tokens")
    books = shipped.load_texts()
    old = calibrate(model, tok, {k: books[k] for k in shipped.CALIBRATION_BOOKS}, split=2, tokens=1024, chunk=128,
                    lam="auto", progress=False, context=1)  # what the default calibrated on before the mix
    for key in ("calibration_texts", "calibration_fingerprint", "text_sha256", "calibration_tokens"):
        assert got.meta[key] == old.meta[key], key
    assert got.meta["text_sha256"] == text_hash([books[k] for k in shipped.CALIBRATION_BOOKS])
    assert torch.equal(got.weights, old.weights)
    assert shipped.calibration_set_of(got.meta) == "novels" and shipped.calibration_set_of({"text_sha256": "0" * 64}) is None


def _cfg(root, **kw):
    base = dict(model=str(root / "model"), split=2, tail=32, calib_tokens=1024, chunk=128, docs=1, doc_tokens=200,
                gen_tokens=2, repeats=1, needle_trials=0, select=None, modes=("exact", "ridge"))
    return RunConfig(**{**base, **kw})


def test_run_does_not_reuse_maps_of_another_calibration_set(work, capsys):
    root, model, tok = work
    if not (root / "novels.safetensors").exists():
        _calibrate_novels(root, model, tok)
    out = root / "run"
    out.mkdir(exist_ok=True)
    (out / "maps-S2.safetensors").write_bytes((root / "novels.safetensors").read_bytes())
    (out / "maps-S2.stats.safetensors").write_bytes((root / "novels.stats.safetensors").read_bytes())
    capsys.readouterr()
    rep = run(_cfg(root, out=str(out)), progress=False)  # the default set: the old novels maps are refitted
    printed = capsys.readouterr().out
    assert (f"existing maps at {out / 'maps-S2.safetensors'} not usable (they were calibrated on the shipped "
            "'novels' set: Emma 256,") in printed
    assert "not on the shipped 'mix' calibration set (--calib-set)); calibrating anew" in printed
    assert rep["calibration_set"] == "mix" and rep["calibrated_on"].startswith("the shipped 'mix' set: novels 384")
    assert shipped.calibration_set_of(load_maps(out / "maps-S2.safetensors").meta) == "mix"
    rep = run(_cfg(root, out=str(out)), progress=False)  # now they fit: reused
    assert "calibrating anew" not in capsys.readouterr().out and rep["calibration_set"] == "mix"
    rep = run(_cfg(root, out=str(out), calib_set="novels"), progress=False)  # and back
    assert "calibrating anew" in capsys.readouterr().out and rep["calibration_set"] == "novels"
    # a maps file the user names: used whatever it was fitted on, unless --calib-set asks for another set
    named = str(root / "novels.safetensors")
    rep = run(_cfg(root, out=str(root / "run2"), maps=named), progress=False)
    assert rep["calibration_set"] == "novels" and rep["maps_path"] == named
    with pytest.raises(InputError, match=r"does not fit this run \(they were calibrated on the shipped 'novels' set"):
        run(_cfg(root, out=str(root / "run2"), maps=named, calib_set="mix"), progress=False)
    with pytest.raises(InputError, match="--calib-set 'code' is not a shipped calibration set"):
        run(_cfg(root, out=str(root / "run2"), calib_set="code"), progress=False)
    assert calibration_mismatch(load_maps(named).meta, "novels") is None
    assert "not on the shipped 'mix'" in calibration_mismatch(load_maps(named).meta, "mix")
    # records that disagree with text_sha256 (a renamed text) do not count as the set either
    meta = dict(load_maps(named).meta)
    meta["calibration_texts"] = [dict(r, name="x") for r in meta["calibration_texts"]]
    assert calibration_mismatch(meta, "novels") is not None


def test_eval_commands_refit_maps_of_another_set_and_take_calib_set(work, capsys):
    root, _, _ = work
    out = root / "evalout"
    out.mkdir(exist_ok=True)
    (out / "maps-S2.safetensors").write_bytes((root / "mix.safetensors").read_bytes())
    (out / "maps-S2.stats.safetensors").write_bytes((root / "mix.stats.safetensors").read_bytes())
    args = ["--model", str(root / "model"), "--out", str(out), "--calib-tokens", "1024", "--chunk", "128",
            "--quiet", "--splits", "2", "--docs", "1", "--novel-docs", "0", "--doc-tokens", "200", "--tail", "32",
            "--window", "8", "--tau", "0.5", "--resamples", "50"]
    assert main(["eval", "loss", *args]) == 0
    assert "calibrating anew" not in capsys.readouterr().out  # the mix: the default, reused
    rep = json.loads((out / "loss.json").read_text())
    assert rep["maps"]["2"]["calibrated_on"].startswith("the shipped 'mix' set: novels 384, handbook 384, stdlib 256")
    assert main(["eval", "loss", *args, "--calib-set", "novels"]) == 0
    assert "not on the shipped 'novels' calibration set (--calib-set)); calibrating anew" in capsys.readouterr().out
    rep = json.loads((out / "loss.json").read_text())
    assert rep["maps"]["2"]["calibrated_on"].startswith("the shipped 'novels' set: Emma 256")


def test_eval_maps_file_must_be_of_an_explicit_calib_set(work, capsys):
    """``--maps FILE`` is evaluated as it is, unless ``--calib-set`` is given: then a file of another set
    is refused, as ``ridgefill run`` refuses it."""
    root, _, _ = work
    args = ["--model", str(root / "model"), "--out", str(root / "evalout2"), "--quiet", "--splits", "2", "--docs", "1",
            "--novel-docs", "0", "--doc-tokens", "200", "--tail", "32", "--window", "8", "--tau", "0.5",
            "--resamples", "50", "--maps", str(root / "mix.safetensors")]
    assert main(["eval", "loss", *args, "--calib-set", "mix"]) == 0
    capsys.readouterr()
    assert main(["eval", "loss", *args, "--calib-set", "novels"]) != 0
    err = capsys.readouterr().err
    assert "does not fit --calib-set novels" in err and "not on the shipped 'novels' calibration set" in err


def test_eval_query_agnostic_selection_in_identity_and_none_modes(work, capsys):
    """A leverage selection needs the maps' calibration covariance in every fill mode: the evaluation
    commands load the maps for it and pass them also in modes identity and none."""
    root, _, _ = work
    out = root / "evalout3"
    args = ["--model", str(root / "model"), "--out", str(out), "--quiet", "--splits", "2", "--docs", "1",
            "--novel-docs", "0", "--doc-tokens", "200", "--tail", "32", "--window", "8", "--tau", "0.5",
            "--resamples", "50", "--maps", str(root / "mix.safetensors"), "--modes", "exact,identity,none",
            "--select", "prompt,budget=8", "--select-modes", "identity,none"]
    assert main(["eval", "loss", *args]) == 0
    rep = json.loads((out / "loss.json").read_text())
    variants = {r["variant"] for r in rep["summary"]}
    assert {"2/identity", "2/identity+sel", "2/none", "2/none+sel"} <= variants
    for mode in ("identity", "none"):
        row = {r["variant"]: r["nll"] for r in rep["summary"] if r["set"] == "plain" and r["tokens"] == "all"}
        assert row[f"2/{mode}+sel"] != row[f"2/{mode}"]  # the chosen rows changed the prefill


def test_overlap_with_the_mix_is_refused(work):
    """Evaluation text holding calibration text of the mix (the handbook's first chunk, which the mix's
    evenly spaced chunks always include) is refused, from the recorded fingerprint and, for maps without
    one, from the rebuilt chunks; the evaluation novels pass."""
    root, _, tok = work
    maps = load_maps(root / "mix.safetensors")
    handbook = shipped.load_technical_texts()["handbook"]
    books = shipped.load_texts()
    docs, labels = evaluation_plan(tok, {"notes.txt": "Some notes of mine. " * 5 + handbook[:300]}, 1, 199)
    with pytest.raises(OverlapError, match=r"evaluation document 1 \('notes.txt', tokens 0-200\) overlaps the "
                                           r"calibration text \(the shipped 'mix' set: novels 384"):
        check_evaluation_text(maps, tok, docs, labels, {}, user_text=True)
    ok_docs, ok_labels = evaluation_plan(tok, {k: books[k] for k in shipped.EVALUATION_BOOKS}, 2, 199)
    check_evaluation_text(maps, tok, ok_docs, ok_labels, {}, user_text=True)
    with pytest.raises(OverlapError, match="needle haystack text 'hay' overlaps"):
        check_evaluation_text(maps, tok, ok_docs, ok_labels, {"hay": handbook[:1000]}, user_text=True)
    # a file from before maps recorded their fingerprint: the mix's chunks are rebuilt from text_sha256
    meta = {k: v for k, v in maps.meta.items() if k not in ("calibration_fingerprint", "calibration_texts")}
    old = RidgeMaps(2, maps.weights, maps.biases, maps.lambdas, meta)
    fp = maps_fingerprint(old, tok, required=True)
    assert fp.hashes.tolist() == maps_fingerprint(maps, tok, required=True).hashes.tolist()
    assert calibration_label(meta) == "the shipped 'mix' set (tokens per text unrecorded)"
    with pytest.raises(OverlapError, match="overlaps the calibration text"):
        check_evaluation_text(old, tok, docs, labels, {}, user_text=True)
