"""`ridgefill tune` and the calibration that scales: one Gram decomposition per split, the multi-split
statistics, the choice rule and the memory refusal."""

import pytest
import torch

from ridgefill import InputError, RidgeStats, fit_maps, solve_ridge
from ridgefill.ridge import default_prior, heldout_errors, lambda_grid

F64 = torch.float64


def context_stats(n=300, d=8, layers=4, seed=0, parts=3):
    """Fit and held-out context statistics (``features = 2d``) of correlated random rows."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=F64) + 3.0
    f = torch.cat([h, torch.roll(h, 1, 0) * 0.5], 1)
    w = torch.randn(layers, 2 * d, d, generator=g, dtype=F64) * 0.3
    xs = torch.einsum("nf,lfe->lne", f, w) + torch.randn(layers, n, d, generator=g, dtype=F64) * 0.4 + 1.0
    fit, held = RidgeStats(layers, d, context=1), RidgeStats(layers, d, context=1)
    for i, idx in enumerate(torch.arange(n).chunk(parts * 4)):
        (held if i % 4 == 3 else fit).update(f[idx], xs[:, idx])
    return fit, held


def todays_fit(stats, held, lam, penalty=1.0):
    """The solve before the shared decomposition: one eigh per layer for λ, a Cholesky per layer."""
    raw, raw_held = stats, held
    if penalty != 1:
        scale = penalty ** -0.5
        stats, held = stats.with_context_scale(scale), held.with_context_scale(scale)
    n = stats.layers
    if lam == "auto":
        lams = []
        for layer in range(n):
            gram, _, _ = stats.centred(layer)
            grid = lambda_grid(gram)
            lams.append(float(grid[int(torch.argmin(heldout_errors(stats, held, layer, grid)))]))
        final = raw.merged(raw_held)
    else:
        lams, final = [float(lam)] * n, raw
    if penalty != 1:
        final = final.with_context_scale(penalty ** -0.5)
    mh, mx = final.means()
    ws = []
    torch.set_num_threads(1)
    try:
        for layer in range(n):
            gram, cross, _ = final.centred(layer)
            ws.append(solve_ridge(gram, cross, lams[layer], default_prior(final)))
    finally:
        torch.set_num_threads(n_threads)
    return lams, torch.stack(ws)


n_threads = torch.get_num_threads()


@pytest.mark.parametrize("lam,penalty", [("auto", 1.0), ("auto", 4.0), (0.5, 1.0)])
def test_shared_decomposition_gives_todays_maps(lam, penalty):
    fit, held = context_stats(seed=1)
    lams, weights = todays_fit(fit, held, lam, penalty)
    got = fit_maps(fit, lam, held, context_penalty=penalty)
    assert got.lambdas == lams
    w = got.weights
    if penalty != 1:
        w = w.clone()
        w[:, fit.hidden:] /= penalty ** -0.5
    torch.testing.assert_close(w, weights, rtol=1e-12, atol=1e-12)


def test_one_eigendecomposition_per_split(monkeypatch):
    fit, held = context_stats(seed=2, layers=5)
    calls = []
    real = torch.linalg.eigh

    def counted(a, *args, **kw):
        calls.append(tuple(a.shape))
        return real(a, *args, **kw)

    monkeypatch.setattr(torch.linalg, "eigh", counted)
    res = fit_maps(fit, "auto", held)
    assert calls == [(16, 16)]  # λ for all 5 layers and the held-out report share one eigh
    assert len(res.heldout_rel_error) == 5
    calls.clear()
    fit_maps(fit, 0.3, held)  # a fixed λ: the report alone, still one
    assert calls == [(16, 16)]


def test_heldout_errors_refuses_a_foreign_decomposition():
    from ridgefill.ridge import HeldoutDecomposition

    fit, held = context_stats(seed=3)
    other, _ = context_stats(seed=4)
    dec = HeldoutDecomposition(fit, held)
    lams = torch.tensor([0.1, 1.0], dtype=F64)
    torch.testing.assert_close(heldout_errors(fit, held, 2, lams, decomposition=dec),
                               heldout_errors(fit, held, 2, lams), rtol=0, atol=0)
    with pytest.raises(InputError, match="other statistics"):
        heldout_errors(other, held, 0, lams, decomposition=dec)


# ---- the multi-split pass -------------------------------------------------------------------------------

def _texts():
    g = torch.Generator().manual_seed(7)
    words = ["river", "stone", "quiet", "lamp", "north", "garden", "letter", "winter", "sister", "road"]
    return {f"t{i}": " ".join(words[j] for j in torch.randint(0, 10, (900,), generator=g).tolist())
            for i in range(2)}


def test_multi_split_statistics_equal_separate_calibrate_passes():
    from evaluate_helpers import ByteTokenizer, byte_llama
    from ridgefill.calibration import calibrate, calibrate_many

    model, tok, texts = byte_llama(seed=3), ByteTokenizer(), _texts()
    seen = []
    many = calibrate_many(model, tok, texts, splits=[3, 1], tokens=2048, chunk=256, context=1, progress=False,
                          on_maps=lambda s, m: seen.append((s, m.weights.clone())))
    assert [s for s, _ in seen] == [1, 3]  # handed over as fitted, shallowest first
    for split in (1, 3):
        one = calibrate(model, tok, texts, split=split, tokens=2048, chunk=256, context=1, progress=False)
        a, b = many[split], one
        assert a.lambdas == b.lambdas
        assert torch.equal(a.weights, b.weights) and torch.equal(a.biases, b.biases)
        for k in ("sum_h", "gram", "sum_x", "cross", "sq_x"):
            assert torch.equal(getattr(a.stats, k), getattr(b.stats, k)), k
        assert a.stats.count == b.stats.count == 2048
        assert torch.equal(dict(seen)[split], a.weights)


def test_interrupted_multi_split_pass_resumes_bit_identical(tmp_path, monkeypatch):
    """``tune``'s pass (:func:`calibrate_many` with a checkpoint) resumes after an interruption to the same
    statistics and maps as an uninterrupted pass, and a finished checkpoint needs no forward pass."""
    from evaluate_helpers import ByteTokenizer, byte_llama
    from ridgefill.calibration import calibrate_many

    model, tok, texts = byte_llama(seed=3), ByteTokenizer(), _texts()
    kw = dict(splits=[3, 1], tokens=2048, chunk=256, context=1, progress=False)  # 8 chunks
    reference = calibrate_many(model, tok, texts, **kw)
    ckpt = tmp_path / "tune.checkpoint.safetensors"
    real, calls = RidgeStats.update, {"n": 0}

    def failing(self, h, xs):  # two splits: two updates per fit chunk; stop inside the fifth chunk
        calls["n"] += 1
        if calls["n"] > 9:
            raise KeyboardInterrupt("injected interruption")
        real(self, h, xs)

    monkeypatch.setattr(RidgeStats, "update", failing)
    with pytest.raises(KeyboardInterrupt):
        calibrate_many(model, tok, texts, checkpoint=ckpt, checkpoint_every=2, **kw)
    monkeypatch.setattr(RidgeStats, "update", real)
    assert ckpt.exists()
    resumed = calibrate_many(model, tok, texts, checkpoint=ckpt, checkpoint_every=2, **kw)
    monkeypatch.setattr(RidgeStats, "update", lambda *a: pytest.fail("no chunk should be recomputed"))
    again = calibrate_many(model, tok, texts, checkpoint=ckpt, checkpoint_every=2, **kw)
    for split in (1, 3):
        for got in (resumed[split], again[split]):
            a = reference[split]
            assert got.lambdas == a.lambdas
            assert torch.equal(got.weights, a.weights) and torch.equal(got.biases, a.biases)
            for k in ("sum_h", "gram", "sum_x", "cross", "sq_x"):
                assert torch.equal(getattr(got.stats, k), getattr(a.stats, k)), k


# ---- candidates, memory, choice -------------------------------------------------------------------------

def test_default_splits_every_other_layer_from_a_quarter_to_three_quarters():
    from ridgefill.evaluate.tune import default_splits

    assert default_splits(30) == [8, 10, 12, 14, 16, 18, 20, 22]  # SmolLM2
    assert default_splits(18) == [5, 7, 9, 11, 13]  # Gemma 3 270M: 4.5 -> 5, 13.5 -> 14 capped by the step
    assert default_splits(6) == [2, 4]
    assert default_splits(2) == [0]
    with pytest.raises(InputError, match="at least 2 layers"):
        default_splits(1)


def test_pass_memory_counts_every_candidate_and_refuses_clearly():
    from ridgefill.evaluate.tune import check_memory, pass_memory, stats_bytes

    # SmolLM2: d = 576, context features 1152, S = 8 has 21 late layers
    f, k = 1152, 576
    assert stats_bytes(30, 576, 8, 1) == 2 * 8 * (f + f * f + 21 * (2 * k + f * k + 1) + f)
    splits = [8, 10, 12, 14, 16, 18, 20, 22]
    need = pass_memory(30, 576, splits, 1)
    assert need == sum(stats_bytes(30, 576, s, 1) for s in splits) + 2 * stats_bytes(30, 576, 8, 1)
    assert 1.5 * 2**30 < need < 2 * 2**30
    assert check_memory(30, 576, splits, 1, need) == need
    with pytest.raises(InputError) as e:
        check_memory(30, 576, splits, 1, 2**30)
    msg = str(e.value)
    assert "8 candidate splits" in msg and "GiB" in msg and "more than the 1.00 GiB available" in msg
    fewer = [int(v) for v in msg.split("--splits ")[1].split(",")[:4] if v.strip().isdigit()]
    assert fewer and pass_memory(30, 576, fewer, 1) <= 2**30
    with pytest.raises(InputError, match="even one split does not fit"):
        check_memory(30, 576, splits, 1, 10 * 2**20)


def _row(split, key, single, multikey=100.0, exact=(100.0, 100.0)):
    return {"split": split, "key_dnll": key, "needles": {"single": single, "multikey": multikey},
            "exact_needles": {"single": exact[0], "multikey": exact[1]}}


def test_choice_is_the_shallowest_split_meeting_the_budget():
    from ridgefill.evaluate.tune import Budget, choose_split

    rows = [_row(8, 0.9, 50.0), _row(10, 0.45, 100.0, 90.0), _row(12, 0.3, 100.0), _row(14, 0.2, 100.0)]
    b = Budget()
    assert choose_split(rows, b) == 12  # S=10: multikey 90 < 95 % of 100
    assert choose_split(rows, Budget(needle_fraction=0.9)) == 10
    assert choose_split(rows, Budget(needle_fraction=0.9, max_key_dnll=0.4)) == 12
    assert choose_split(rows, Budget(needle_fraction=0.0, max_key_dnll=1.0)) == 8
    assert choose_split(rows, Budget(max_key_dnll=0.1)) is None
    # exact's score sets the bar: 75 % of an exact 80 % is 60 %
    assert choose_split([_row(6, 0.1, 60.0, 60.0, exact=(80.0, 80.0))], Budget(needle_fraction=0.75)) == 6
    assert choose_split([_row(6, None, 100.0)], b) is None  # no key tokens: not met
    assert choose_split(list(reversed(rows)), b) == 12  # order does not matter
    # with selection settings: the highest FLOP bound among the candidates that meet the budget
    from ridgefill.evaluate.tune import choose

    def cand(split, select, bound, key, multikey):
        return dict(_row(split, key, 100.0, multikey), select=select, flop_bound=bound)

    rows = [cand(8, "off", 1.50, 0.9, 40.0), cand(8, "two-pass", 1.40, 0.45, 100.0),
            cand(12, "off", 1.45, 0.3, 100.0), cand(12, "two-pass", 1.30, 0.2, 100.0)]
    assert (choose(rows, b)["split"], choose(rows, b)["select"]) == (12, "off")  # plain at 12 beats selection at 8
    rows[2]["needles"]["multikey"] = 80.0  # plain fails multikey there: the cheapest mode that keeps it
    assert (choose(rows, b)["split"], choose(rows, b)["select"]) == (8, "two-pass")
    for bad in (dict(needle_fraction=1.5), dict(needle_fraction=-0.1), dict(max_key_dnll=-1.0),
                dict(max_key_dnll=float("nan"))):
        with pytest.raises(InputError):
            Budget(**bad)


def test_check_splits_refuses_out_of_range_and_repeats():
    from ridgefill.evaluate.tune import check_splits

    assert check_splits([10, 4, 8], 30) == [4, 8, 10]
    with pytest.raises(InputError, match="this model has 30 layers"):
        check_splits([29], 30)
    with pytest.raises(InputError, match="repeat"):
        check_splits([8, 8], 30)


# ---- end to end -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from evaluate_helpers import save_byte_model
    from ridgefill.data.texts import EVALUATION_BOOKS, load_texts
    from ridgefill.evaluate.tune import Budget, TuneConfig, tune

    root = tmp_path_factory.mktemp("tune")
    save_byte_model(root / "model", seed=5)
    books = load_texts()
    (root / "eval.txt").write_text(books[EVALUATION_BOOKS[0]][:20000])
    other = next(k for k in books if k not in EVALUATION_BOOKS)
    (root / "calib.txt").write_text(books[other][:12000])
    cfg = TuneConfig(model=str(root / "model"), splits=(3, 1), texts=(str(root / "eval.txt"),),
                     calib_texts=(str(root / "calib.txt"),), calib_tokens=4096, chunk=512, docs=2, doc_tokens=1024,
                     tail=32, window=16, tau=0.05, needle_trials=1, multikey=False, needle_tail=192, repeats=1, resamples=200,
                     budget=Budget(needle_fraction=0.0, max_key_dnll=100.0), out=str(root / "out"))
    return tune(cfg, progress=False), root


def test_tune_writes_the_chosen_maps_and_the_report(tuned):
    from ridgefill.maps import load_maps

    report, root = tuned
    out = root / "out"
    # the loosest budget: the highest FLOP bound, the shallowest split with the plain fill
    assert report["splits"] == [1, 3] and report["chosen_split"] == 1 and report["chosen_select"] == "off"
    chosen = load_maps(out / "maps.safetensors")
    candidate = load_maps(out / "maps-S1.safetensors")
    assert chosen.split == 1 and torch.equal(chosen.weights, candidate.weights)
    assert chosen.select == "off" and candidate.select is None  # the setting prefill's select="auto" follows
    assert [(r["split"], r["select"]) for r in report["rows"]] == [
        (s, name) for s in (1, 3) for name in ("off", "one-pass", "two-pass")]
    assert load_maps(out / "maps-S3.safetensors").split == 3
    assert not (out / "tune.checkpoint.safetensors").exists()
    for name in ("tune.json", "tune.md", "tune.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in report["rows"]:
        assert row["key_dnll"] is not None and row["all_dnll"] is not None
        lo, hi = row["all_dnll_ci"]
        assert lo <= row["all_dnll"] <= hi
        assert row["flop_bound"] > 1.0 and row["measured_ratio"] > 0
        assert set(row["needles"]) == set(row["exact_needles"]) == {"single"}
    bound = {(r["split"], r["select"]): r["flop_bound"] for r in report["rows"]}
    for name in ("off", "one-pass", "two-pass"):
        assert bound[1, name] > bound[3, name]  # shallower: more work skipped
    assert bound[1, "off"] > bound[1, "one-pass"] > bound[1, "two-pass"]  # selection costs; one pass costs less
    assert all(r["selected_rows"] > 0 for r in report["rows"] if r["select"] != "off")
    assert "**chosen**" in (out / "tune.md").read_text()


def test_tune_refuses_a_needle_tail_too_short_before_the_pass(tmp_path, monkeypatch, capsys):
    from evaluate_helpers import save_byte_model
    from ridgefill.cli import main
    from ridgefill.data import models

    save_byte_model(tmp_path / "model", seed=5)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(["tune", "--model", str(tmp_path / "model"), "--doc-tokens", "640", "--tail", "48",
                 "--out", str(tmp_path / "out")]) == 2
    assert "shorter than the question segment" in capsys.readouterr().err


def test_tune_refuses_too_many_candidates_before_the_pass(tmp_path, monkeypatch, capsys):
    from evaluate_helpers import save_byte_model
    from ridgefill import calibration
    from ridgefill.cli import main

    from ridgefill.evaluate.tune import pass_memory

    save_byte_model(tmp_path / "model", seed=5)  # 6 layers, d = 64
    monkeypatch.setattr(calibration, "collect_stats_many", lambda *a, **k: pytest.fail("the pass ran"))
    limit = pass_memory(6, 64, [0, 2, 4], 1)
    assert pass_memory(6, 64, [0, 1, 2, 3, 4], 1) > limit
    code = main(["tune", "--model", str(tmp_path / "model"), "--splits", "0,1,2,3,4", "--max-memory",
                 repr(limit / 2**30), "--needle-trials", "0", "--calib-tokens", "4096", "--doc-tokens", "1024",
                 "--tail", "32", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "the statistics of 5 candidate splits [0, 1, 2, 3, 4] need" in err
    assert "give fewer candidates, e.g. --splits 0,2,4" in err
    assert not (tmp_path / "out").exists()


def test_tune_refuses_evaluation_text_from_the_calibration_text_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from evaluate_helpers import save_byte_model
    from ridgefill.cli import main
    from ridgefill.data import models
    from ridgefill.data.texts import EVALUATION_BOOKS, load_texts

    save_byte_model(tmp_path / "model", seed=5)
    book = load_texts()[EVALUATION_BOOKS[0]][:20000]
    (tmp_path / "a.txt").write_text(book)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    code = main(["tune", "--model", str(tmp_path / "model"), "--text", str(tmp_path / "a.txt"), "--calib-text",
                 str(tmp_path / "a.txt"), "--calib-tokens", "4096", "--doc-tokens", "768", "--tail", "32",
                 "--needle-trials", "0", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "calibration text files" in err and "document 1" in err
    assert "calibrate on text without it (--calib-text)" in err and "--maps NEW" not in err


@pytest.mark.parametrize("args, message", [
    (["--maps", "{tmp}"], "is a folder: give the file's path"),
    (["--out", "{tmp}/model/config.json/out"], "cannot be created"),
    (["--maps", "{tmp}/model/config.json/maps.safetensors"], "cannot be created"),
    (["--splits", "2,2"], "repeat a split"),
    (["--lam", "-1"], "--lam -1.0 must be 'auto' or a finite number ≥ 0"),
    (["--calib-tokens", "1024"], "--calib-tokens 1024 must be at least 2048"),
    (["--max-memory", "inf"], "must be a finite positive number of GiB"),
    (["--max-memory", "1e-12"], "must be a finite positive number of GiB"),
    (["--threads", "0"], "must be at least 1"),
    (["--selects", "off,auto"], "'auto' follows the maps' recorded setting"),
    (["--selects", "off,off"], "repeats a setting"),
    (["--selects", "sometimes"], "use one of auto, on, two-pass, one-pass, prompt, off"),
    (["--doc-tokens", "64", "--tail", "10"], "--doc-tokens 64 must be longer than the needle prompts' exact tail"),
])
def test_tune_refuses_bad_settings_before_the_model_loads(tmp_path, monkeypatch, capsys, args, message):
    from evaluate_helpers import save_byte_model
    from ridgefill.cli import main
    from ridgefill.data import models

    save_byte_model(tmp_path / "model", seed=5)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    code = main(["tune", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "out")]
                + [a.format(tmp=tmp_path) for a in args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_tune_without_a_choice_writes_the_report_and_removes_an_earlier_maps_file(tmp_path, capsys):
    import json

    from evaluate_helpers import save_byte_model
    from ridgefill.cli import main
    from ridgefill.data.texts import EVALUATION_BOOKS, load_texts

    save_byte_model(tmp_path / "model", seed=5)
    books = load_texts()
    (tmp_path / "eval.txt").write_text(books[EVALUATION_BOOKS[0]][:20000])
    (tmp_path / "calib.txt").write_text(next(v for k, v in books.items() if k not in EVALUATION_BOOKS)[:12000])
    out = tmp_path / "out"
    out.mkdir()
    (out / "maps.safetensors").write_bytes(b"an earlier run's choice")
    (out / "maps.stats.safetensors").write_bytes(b"its statistics")
    code = main(["tune", "--model", str(tmp_path / "model"), "--splits", "3", "--text", str(tmp_path / "eval.txt"),
                 "--calib-text", str(tmp_path / "calib.txt"), "--calib-tokens", "4096", "--docs", "1",
                 "--doc-tokens", "1024", "--tail", "32", "--needle-trials", "0", "--repeats", "1",
                 "--max-key-dnll", "0", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert ("no candidate split in [3] meets the budget with any selection setting (off, one-pass, two-pass; "
            "key-token ΔNLL ≤ 0.0)") in err
    assert "was removed" in err and "loosen --max-key-dnll" in err and "--min-needles" not in err
    report = json.loads((out / "tune.json").read_text())
    assert report["chosen_split"] is None and report["maps_path"] is None
    assert not (out / "maps.safetensors").exists() and not (out / "maps.stats.safetensors").exists()
    assert (out / "maps-S3.safetensors").exists() and (out / "tune.md").exists()


def test_tune_interrupted_says_how_to_resume(tmp_path, monkeypatch, capsys):
    from ridgefill.cli import main
    from ridgefill.evaluate import tune as tune_module

    def interrupted(cfg, progress=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_module, "tune", interrupted)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:  # exit status 130, as for SIGINT
        main(["tune", "--out", str(out)])
    assert e.value.code == 130
    assert "no pass checkpoint exists" in capsys.readouterr().err
    out.mkdir()
    (out / "tune.checkpoint.safetensors").write_bytes(b"statistics")
    with pytest.raises(SystemExit) as e:
        main(["tune", "--out", str(out)])
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "tune.checkpoint.safetensors" in err and "run the same command again to resume" in err


def test_tune_settings_on_a_dense_model_are_the_defaults_or_those_named():
    from ridgefill.evaluate.tune import TUNE_SELECTS, selects_for
    from conftest import tiny_llama
    from ridgefill.select import ONE_PASS_SELECT, TWO_PASS_SELECT

    model = tiny_llama()
    assert selects_for(model, None) == {"off": None, "one-pass": ONE_PASS_SELECT, "two-pass": TWO_PASS_SELECT}
    assert tuple(selects_for(model, None)) == TUNE_SELECTS
    assert selects_for(model, ("two-pass",)) == {"two-pass": TWO_PASS_SELECT}
    assert selects_for(model, ("off", "on")) == {"off": None, "one-pass": ONE_PASS_SELECT}  # recorded as what it is
    from ridgefill.select import as_select

    for name in ("on,budget=0.1", "two-pass,budget=0.1", "prompt,budget=35"):  # what the maps file records parses back
        ((recorded, sel),) = selects_for(model, (name,)).items()
        assert as_select(recorded) == sel
    assert list(selects_for(model, ("prompt,budget=35", "two-pass"))) == ["prompt,budget=35", "two-pass"]
    with pytest.raises(InputError, match="'one-pass' is the same selection as 'on'"):
        selects_for(model, ("on", "one-pass"))
