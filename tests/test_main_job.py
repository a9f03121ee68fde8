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
                    repeats=1, out=str(out))
    return run(cfg, progress=False), out


def test_main_job_figures_are_finite_and_plausible(report):
    rep, out = report
    modes = rep["modes"]
    assert set(modes) == {"exact", "ridge", "identity", "none"}
    for r in modes.values():
        assert math.isfinite(r["nll"]) and r["prefill_seconds"] > 0 and 0 <= r["agreement"] <= 1
    assert 1.5 < modes["exact"]["nll"] < 6.0  # SmolLM2 on Austen: perplexity ~25 -> ~3.2 nats
    assert modes["exact"]["delta_nll"] == 0 and modes["exact"]["agreement"] == 1.0
    # the fitted map loses less than dropping the late-layer cache of the filled rows
    assert modes["ridge"]["delta_nll"] < modes["none"]["delta_nll"]
    assert modes["none"]["delta_nll"] > 0.05
    assert rep["calibration_tokens"] == 8192 and len(rep["lambdas"]) == 30 - 15 - 1
    assert rep["scored_tokens_per_mode"] == 128


def test_main_job_writes_report_and_maps(report):
    rep, out = report
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["modes"]["ridge"]["nll"] == rep["modes"]["ridge"]["nll"]
    assert (out / "maps-S15.safetensors").is_file()
    table = format_table(rep)
    for mode in ("exact", "ridge", "identity", "none"):
        assert mode in table


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
