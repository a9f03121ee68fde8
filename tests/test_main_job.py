"""The main job on the bundled real model and text, CI-sized; and the CLI's error handling."""

import json
import math

import pytest

from ridgefill.cli import main
from ridgefill.run import RunConfig, format_table, run


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = RunConfig(split=15, tail=128, calib_tokens=8192, chunk=512, docs=1, doc_tokens=768, gen_tokens=8,
                    repeats=1, out=str(out), needle_trials=2)
    return run(cfg, progress=False), out


def test_main_job_figures_are_finite_and_plausible(report):
    rep, out = report
    modes = rep["modes"]
    assert list(modes) == ["exact", "ridge", "ridge+sel", "centred", "identity", "none"]
    for r in modes.values():
        assert math.isfinite(r["nll"]) and r["prefill_seconds"] > 0 and 0 <= r["agreement"] <= 1
    assert 1.5 < modes["exact"]["nll"] < 6.0  # SmolLM2 on Austen: perplexity ~25 -> ~3.2 nats
    assert modes["exact"]["delta_nll"] == 0 and modes["exact"]["agreement"] == 1.0
    # the fitted map loses less than dropping the late-layer cache of the filled rows
    assert modes["ridge"]["delta_nll"] < modes["none"]["delta_nll"]
    assert modes["none"]["delta_nll"] > 0.05
    assert rep["calibration_tokens"] == 8192 and len(rep["lambdas"]) == 30 - 15 - 1
    assert rep["scored_tokens_per_mode"] == 128 and rep["model"].startswith("SmolLM2")
    # selection: a few more exact rows (within the default budget), none for the other systems
    assert 0 < modes["ridge+sel"]["extra_exact_rows_share"] <= 0.05
    assert all(modes[m]["extra_exact_rows_share"] == 0 for m in modes if m != "ridge+sel")
    assert all(modes[m]["needle_score"] in (0.0, 50.0, 100.0) for m in modes) and rep["needle_trials"] == 2
    assert modes["exact"]["needle_score"] == 100.0  # a 768-token single needle: the exact model finds it


def test_main_job_writes_report_and_maps(report):
    rep, out = report
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["modes"]["ridge"]["nll"] == rep["modes"]["ridge"]["nll"]
    assert (out / "maps-S15.safetensors").is_file()
    table = format_table(rep)
    for mode in ("exact", "ridge", "ridge+sel", "centred", "identity", "none"):
        assert mode in table
    assert "needle" in table and "extra rows" in table


def test_cli_errors_exit_2_with_a_clear_message(tmp_path, capsys):
    assert main(["generate", "--prompt-file", str(tmp_path / "missing.txt"), "--mode", "identity",
                 "--split", "3"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["run", "--split", "29", "--out", str(tmp_path)]) == 2
    assert "--split 29 is out of range" in capsys.readouterr().err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a maps file")
    prompt = tmp_path / "p.txt"
    prompt.write_text("It is a truth universally acknowledged.")
    assert main(["generate", "--maps", str(bad), "--prompt-file", str(prompt)]) == 2
    assert "truncated or corrupted" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--tail", "0"], "--tail 0 must be at least 1"),
    (["--repeats", "0"], "--repeats 0 must be at least 1"),
    (["--docs", "0"], "--docs 0 must be at least 1"),
    (["--gen-tokens", "0"], "--gen-tokens 0 must be at least 1"),
    (["--threads", "-1"], "--threads -1 must be at least 1"),
    (["--lam", "-1"], "--lam -1.0 must be 'auto'"),
])
def test_run_rejects_bad_sizes_before_loading_anything(tmp_path, capsys, args, message):
    assert main(["run", "--out", str(tmp_path / "out"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing calibrated, nothing written


def test_a_named_maps_file_that_does_not_fit_is_never_replaced(report, tmp_path, capsys):
    import hashlib
    import shutil

    _, out = report
    named = tmp_path / "mine.safetensors"
    shutil.copy(out / "maps-S15.safetensors", named)
    shutil.copy(out / "maps-S15.stats.safetensors", tmp_path / "mine.stats.safetensors")
    before = hashlib.sha256(named.read_bytes()).hexdigest()
    # fitted at S=15 on 8192 tokens: a run at another split, or asking for more tokens, does not fit
    for extra in (["--split", "10"], ["--calib-tokens", "65536"]):
        assert main(["run", "--maps", str(named), "--out", str(tmp_path / "o"), "--docs", "1",
                     "--doc-tokens", "512", "--tail", "64", *extra]) == 2
        err = capsys.readouterr().err
        assert "does not fit this run" in err and "pass a new --maps path" in err
        assert hashlib.sha256(named.read_bytes()).hexdigest() == before
    # too many documents for the text: rejected before any calibration, the file untouched
    assert main(["run", "--maps", str(tmp_path / "new.safetensors"), "--out", str(tmp_path / "o"),
                 "--docs", "1000", "--doc-tokens", "2048"]) == 2
    assert "lower --docs" in capsys.readouterr().err and not (tmp_path / "new.safetensors").exists()


def test_generate_rejects_an_empty_prompt(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert main(["generate", "--prompt-file", str(empty), "--mode", "identity", "--split", "3"]) == 2
    assert "is empty" in capsys.readouterr().err
