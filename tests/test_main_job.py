"""The main job (``ridgefill run``) on the bundled real model and text, CI-sized: its figures against
recorded values, its report and maps; the command line's checks."""

import hashlib
import json
import shutil

import pytest

from ridgefill.cli import main
from ridgefill.evaluate.main_job import RunConfig, format_table, run

#: A CI-sized main job: the bundled SmolLM2 at S = 15, context maps fitted on 8,192 tokens of the shipped
#: mix, one held-out document of 768 tokens with a 128-row tail, two single-needle prompts.
CI_SIZED = dict(split=15, tail=128, calib_tokens=8192, chunk=512, docs=1, doc_tokens=768, gen_tokens=8,
                repeats=1, needle_trials=2)

#: Its figures, per system: (NLL nats/token, greedy agreement with exact, extra exact rows, needles in %).
#: Recorded with the reference implementation; the same figures to 3 decimals before and after the package
#: layout and the API were redesigned (docs/evaluate.md, "The main job").
RECORDED = {
    "exact": (3.91347, 1.0, 0.0, 100.0),
    "ridge": (3.98984, 1.0, 0.0, 0.0),
    "ridge+sel": (3.97791, 1.0, 19 / 384, 0.0),
    "centred": (4.06460, 1.0, 0.0, 0.0),
    "identity": (4.19061, 0.5, 0.0, 0.0),
    "none": (5.18440, 0.375, 0.0, 0.0),
}
#: float32 forward passes on 1 or 2 threads: the NLL moves by less than 1e-4 nats/token.
NLL_TOL = 1e-3


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    return run(RunConfig(out=str(out), **CI_SIZED), progress=False), out


def test_main_job_figures_match_the_recorded_ones(report):
    rep, _ = report
    modes = rep["modes"]
    assert list(modes) == ["exact", "ridge", "ridge+sel", "centred", "identity", "none"]
    for name, (nll, agree, extra, needle) in RECORDED.items():
        r = modes[name]
        assert r["nll"] == pytest.approx(nll, abs=NLL_TOL), name
        assert r["delta_nll"] == pytest.approx(nll - RECORDED["exact"][0], abs=NLL_TOL), name
        assert r["agreement"] == pytest.approx(agree, abs=1e-9), name
        assert r["extra_exact_rows_share"] == pytest.approx(extra, abs=1e-9), name
        assert r["needle_score"] == needle, name
    assert modes["exact"]["delta_nll"] == 0 and modes["exact"]["agreement"] == 1.0
    assert rep["calibration_tokens"] == 8192 and len(rep["lambdas"]) == 30 - 15 - 1 and rep["context"] == 1
    assert rep["scored_tokens_per_mode"] == 128 and rep["model"].startswith("SmolLM2")
    assert rep["commit"] is None or len(rep["commit"].split("+")[0]) == 12


def test_main_job_writes_report_and_maps(report):
    rep, out = report
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["modes"]["ridge"]["nll"] == rep["modes"]["ridge"]["nll"]
    assert (out / "maps-S15.safetensors").is_file() and (out / "maps-S15.stats.safetensors").is_file()
    assert not (out / "maps-S15.checkpoint.safetensors").exists()  # removed once the maps are written
    table = format_table(rep)
    for mode in ("exact", "ridge", "ridge+sel", "centred", "identity", "none"):
        assert mode in table
    assert "needle" in table and "extra rows" in table


def test_rigorous_certificate_of_every_late_layer(report, capsys):
    """``ridgefill certify --rigorous`` on the maps the CI-sized main job wrote: every late layer's weights
    and bias pass (``KvaLean.gram_err_le_residual``, ``gram_gap``, ``bias_err_le``; docs/kvalean.md)."""
    _, out = report
    assert main(["certify", str(out / "maps-S15.safetensors"), "--rigorous"]) == 0
    certs = json.loads((out / "maps-S15.certs" / "rigorous.json").read_text())
    assert [c["layer"] for c in certs] == list(range(16, 30))
    for c in certs:
        assert c["passed"] and c["gap_passed"] and c["bias_passed"] and c["reg_eig_lower"] > 0, c
        assert c["excess_bound"] <= c["max_excess_rel"] * c["objective_lower"] + c["storage_floor_upper"]
        assert c["bias_residual_upper"] <= c["bias_allowance_lower"] and c["bias_error_bound"] < float("inf")
    assert "rigorous certificates:" in capsys.readouterr().out


def test_a_named_maps_file_that_does_not_fit_is_never_replaced(report, tmp_path, capsys):
    _, out = report
    named = tmp_path / "mine.safetensors"
    shutil.copy(out / "maps-S15.safetensors", named)
    shutil.copy(out / "maps-S15.stats.safetensors", tmp_path / "mine.stats.safetensors")
    before = hashlib.sha256(named.read_bytes()).hexdigest()
    # fitted at S=15 on 8,192 tokens: a run at another split, or with the default 65,536 tokens, does not fit
    for extra in (["--split", "10"], []):
        assert main(["run", "--maps", str(named), "--out", str(tmp_path / "o"), *extra]) == 2
        err = capsys.readouterr().err
        assert "does not fit this run" in err and "pass a new --maps path" in err
        assert hashlib.sha256(named.read_bytes()).hexdigest() == before


def test_run_on_a_short_text_takes_the_documents_it_holds_and_refuses_too_little(tmp_path, capsys):
    """A text holding fewer than 4 documents of 2,049 tokens is evaluated on as many as it holds; one shorter
    than a document is refused before the model loads, and nothing is written."""
    from ridgefill.data.models import load_tokenizer
    from ridgefill.data.texts import EVALUATION_BOOKS, load_texts
    from ridgefill.evaluate.documents import document_room

    tok = load_tokenizer()
    book = load_texts()[EVALUATION_BOOKS[0]]
    short = tmp_path / "short.txt"
    short.write_text(book[:4000])
    assert main(["run", "--text", str(short), "--out", str(tmp_path / "out")]) == 2
    assert "hold no document of 2049 tokens" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    two = {"doc": book[:60000]}
    assert document_room(tok, two, 2048) == len(tok(two["doc"], add_special_tokens=False)["input_ids"]) // 2049


@pytest.mark.parametrize("args,message", [
    (["run", "--tail", "0"], "--tail 0 must be at least 1"),
    (["run", "--threads", "-1"], "argument --threads: -1 must be at least 1"),
    (["run", "--select", "budget=4"], "use one of auto, on, two-pass, one-pass, prompt, off"),
    (["calibrate", "--lam", "x", "--out", "m.safetensors"], "λ must be a number or 'auto'"),
    (["calibrate", "--out", "."], "is a folder"),
    (["generate", "--prompt-file", "missing.txt"], "does not exist"),
    (["generate", "--prompt-file", "p.txt"], "--maps FILE is needed for the fill"),
    (["generate", "--prompt-file", "p.txt", "--maps", "bad.safetensors"], "truncated or corrupted"),
    (["generate", "--prompt-file", "p.txt", "--maps", "bad.safetensors", "--max-new-tokens", "0"],
     "--max-new-tokens 0 must be at least 1"),
])
def test_bad_input_is_one_error_line_before_any_model_loads(tmp_path, monkeypatch, capsys, args, message):
    import ridgefill.data.models as models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("It is a truth universally acknowledged.")
    (tmp_path / "bad.safetensors").write_bytes(b"not a maps file")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and len(err.strip().splitlines()) == 1
