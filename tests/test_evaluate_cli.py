"""``ridgefill eval ...`` and ``ridgefill report`` end to end on a tiny random model saved as a local
Hugging Face directory (byte-level tokenizer), with maps fitted beforehand on the shipped calibration set
and reused from ``--out``."""

import json

import pytest

from ridgefill.data.texts import calibration_texts
from ridgefill.calibration import calibrate
from ridgefill.cli import main
from evaluate_helpers import save_byte_model


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalcli")
    model, tok = save_byte_model(root / "model", seed=5)
    for split in (2, 3):  # on the default calibration set, with the default context: the eval commands reuse them
        calibrate(model, tok, calibration_texts(), split=split, tokens=1024, chunk=128, lam="auto",
                  progress=False, context=1).save(root / "out" / f"maps-S{split}.safetensors")
    return root


def _run(workdir, *args):
    return main([*args, "--model", str(workdir / "model"), "--out", str(workdir / "out"), "--calib-tokens", "1024",
                 "--chunk", "128", "--quiet"])


LOSS = ["--docs", "2", "--novel-docs", "2", "--doc-tokens", "200", "--tail", "32", "--window", "8", "--tau", "0.5",
        "--resamples", "200"]


def test_eval_commands_and_report(workdir, capsys):
    out = workdir / "out"
    fitted = (out / "maps-S2.safetensors").stat().st_mtime_ns
    assert _run(workdir, "eval", "loss", "--splits", "2", *LOSS) == 0
    assert (out / "maps-S2.safetensors").stat().st_mtime_ns == fitted  # the fixture's maps, reused
    loss = json.loads((out / "loss.json").read_text())
    assert loss["kind"] == "loss" and loss["splits"] == [2] and loss["local_context"] == [9, 16]
    assert {(r["set"], r["tokens"]) for r in loss["summary"]} >= {("plain", "all"), ("novel", "all"), ("all", "all")}
    assert {r["variant"] for r in loss["summary"]} == {"2/ridge", "2/identity", "2/none"}
    assert loss["maps"]["2"]["calibration_tokens"] == 1024 and loss["maps"]["2"]["context"] == 1
    assert len(loss["documents"]) == 4 and all(len(d["exact"]) == 32 for d in loss["documents"])
    assert loss["document_sets"]["novel"]["renamed"]["Persuasion"] > 10

    assert _run(workdir, "eval", "splice", "--splits", "2", "--components", "fill,kv,k_scale", "--key-scale-tokens",
                "256", "--lam-factors", "10", *LOSS) == 0
    splice = json.loads((out / "splice.json").read_text())
    kv = [r for r in splice["summary"] if r["variant"] == "2/ridge+kv"]
    assert kv and all(abs(r["delta_nll"]["mean"]) < 1e-5 for r in kv)
    assert {"2/ridge+kscale", "2/ridge@lam×10"} <= {r["variant"] for r in splice["summary"]}
    assert len(splice["key_scales"]["2"]) == 3 and splice["lam_factors"] == [10.0]

    import ridgefill.evaluate.needles as needles_module

    ran = []  # the load average reads 1.0 before the needle run and 2.0 once it has started
    real_run = needles_module.run_needles
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("os.getloadavg", lambda: (2.0 if ran else 1.0,) * 3)
        mp.setattr(needles_module, "run_needles", lambda *p, **k: ran.append(1) or real_run(*p, **k))
        assert _run(workdir, "eval", "needle", "--lengths", "1500", "--trials", "2", "--variants", "single,multikey",
                    "--modes", "exact,ridge,none", "--splits", "2", "--needle-tail", "200") == 0
    needle = json.loads((out / "needle.json").read_text())
    # the start's load average is read before the run (the header is built after it), the end's after
    assert ran and needle["load_average_start"] == [1.0] * 3 and needle["load_average_end"] == [2.0] * 3
    assert len(needle["trials"]) == 4 and all(t["needle_in_filled_rows"] for t in needle["trials"])
    assert {r["system"] for r in needle["scores"]} == {"exact", "2/ridge", "2/none"}

    # the selection systems alone answer the same cases as beside exact (a selection set beside an earlier
    # run's exact answers)
    args = ["--lengths", "1500", "--trials", "2", "--variants", "single,multikey", "--splits", "2",
            "--needle-tail", "200", "--select", "prompt,budget=30", "--json", str(out / "needle-sel.json")]
    assert _run(workdir, "eval", "needle", *args, "--modes", "exact") == 0
    both = json.loads((out / "needle-sel.json").read_text())
    assert _run(workdir, "eval", "needle", *args, "--modes", "") == 0
    alone = json.loads((out / "needle-sel.json").read_text())
    assert {r["system"] for r in alone["scores"]} == {"2/ridge+sel"} and alone["modes"] == []
    assert [t["results"]["2/ridge+sel"] for t in alone["trials"]] == [t["results"]["2/ridge+sel"] for t in both["trials"]]
    assert [t["answer"] for t in alone["trials"]] == [t["answer"] for t in both["trials"]]

    assert _run(workdir, "eval", "depth", "--depths", "1/3,1/2", "--needle-length", "1500", "--needle-trials", "1",
                "--needle-tail", "200", *LOSS) == 0
    depth = json.loads((out / "depth.json").read_text())
    assert depth["splits"] == [2, 3] and depth["depths"] == ["1/3", "1/2"]
    assert {r["variant"] for r in depth["loss"]["summary"]} == {f"{s}/{m}" for s in (2, 3) for m in ("ridge", "identity", "none")}
    assert len(depth["needles"]["trials"]) == 1

    files = [str(out / f) for f in ("depth.json", "loss.json", "splice.json", "needle.json")]
    assert main(["report", *files, "--out", str(out / "report")]) == 0
    md = (out / "report" / "report.md").read_text()
    assert "### Depth table" in md and "### Splice tests" in md and "### Needle retrieval" in md
    assert "| 1/3 | 2 |" in md and "exact K and V" in md and "fitted key-scale correction" in md
    pngs = sorted(p.name for p in (out / "report").glob("*.png"))
    assert len(pngs) == 3 and all((out / "report" / p).stat().st_size > 1000 for p in pngs)
    # an xz-compressed input gives the same report
    import lzma

    (out / "depth.json.xz").write_bytes(lzma.compress((out / "depth.json").read_bytes()))
    assert main(["report", str(out / "depth.json.xz"), "--out", str(out / "report-xz")]) == 0
    assert main(["report", str(out / "depth.json"), "--out", str(out / "report-plain")]) == 0
    assert ((out / "report-xz" / "report.md").read_text().replace("depth.json.xz", "depth.json")
            == (out / "report-plain" / "report.md").read_text())


def test_eval_bad_input(workdir, capsys, tmp_path):
    assert _run(workdir, "eval", "needle", "--variants", "triple") == 2
    assert "unknown needle variant" in capsys.readouterr().err
    assert _run(workdir, "eval", "needle", "--modes", "") == 2
    assert "leaves nothing to run" in capsys.readouterr().err
    assert _run(workdir, "eval", "loss", "--splits", "2", "--doc-tokens", "100", "--tail", "100") == 2
    assert "--tail 100 must be shorter" in capsys.readouterr().err
    assert _run(workdir, "eval", "loss", "--splits", "9", "--doc-tokens", "100", "--tail", "10") == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "x.json").write_text(json.dumps({"kind": "other"}))
    assert main(["report", str(tmp_path / "x.json")]) == 2
    assert "not the output of `ridgefill eval`" in capsys.readouterr().err


def test_every_command_prints_its_help(capsys):
    """``ridgefill <command> --help`` (and ``eval <kind> --help``) formats every option's help: argparse
    reads a bare ``%`` in a help string as a format and fails, so every percent sign must be ``%%``."""
    import argparse

    from ridgefill.cli import build_parser

    parser = build_parser()
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    paths = []
    for name, sub in commands.items():
        paths.append([name])
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                paths += [[name, kind] for kind in action.choices]
    assert ["bench"] in paths and ["eval", "needle"] in paths
    for path in paths:
        with pytest.raises(SystemExit) as e:
            parser.parse_args(path + ["--help"])
        assert e.value.code == 0, path
        assert "--" in capsys.readouterr().out
