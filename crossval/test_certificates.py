"""Certificates: numeric ones from ``ridgefill certify`` against the criterion of ``KvaLean.Ridge``, and
exact ones against the mirror of the Lean checker ``KvaLean.RidgeInstance.check`` (whose kernel run
on the committed ``KvaLean/CertExamples.lean`` is part of the CI Lean step)."""

from __future__ import annotations

import json
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ridgefill import RidgeMaps, cli, fit_maps, solve_ridge
from ridgefill.certify import (
    CertificateError,
    ExactInstance,
    certify_maps,
    check_certificate,
    check_exact,
    instance_from_stats,
    lean_certificate_source,
    perturbed,
    read_certificate,
    solved_instance,
    stats_digest,
    stats_slice,
)
from ridgefill.maps import load_maps, load_stats, stats_path

from crossval import tally
from crossval.lean_certs import (
    HEADER,
    LEAN_FILE,
    SLICE,
    build,
    data_instances,
    parse_lean_certificates,
)
from crossval.models import CONFIGS, fitted_maps
from crossval.problems import EPS, F64, condition
from crossval.real import real_maps

# theorems whose criterion the certificates check (registry names)
NUMERIC = ("KvaLean.ridge_optimal", "KvaLean.ridge_unique")
EXACT = ("KvaLean.RidgeInstance.check_sound", "KvaLean.RidgeInstance.optimal_of_check",
         "KvaLean.RidgeInstance.unique_of_check")


def record(theorems: tuple[str, ...], n: int = 1) -> None:
    tally.certificate(*theorems, n=n)


def certify_cli(maps: RidgeMaps, folder: Path) -> tuple[list[dict], RidgeMaps, object]:
    """Save ``maps`` (with statistics) under ``folder``, run ``ridgefill certify`` on them, and return
    the certificates, the maps and the statistics as read back from disk."""
    path = maps.save(folder / "maps.safetensors")
    assert stats_path(path).is_file()
    assert cli.main(["certify", str(path), "--out", str(folder / "certs")]) == 0
    files = sorted((folder / "certs").glob("layer-*.json"))
    assert len(files) == len(maps.lambdas)
    return [read_certificate(f) for f in files], load_maps(path), load_stats(stats_path(path))[0]


def check_all(certs: list[dict], maps: RidgeMaps, stats) -> None:
    """Every certificate passes, recomputed from the files, and records what it certifies."""
    for i, cert in enumerate(certs):
        assert cert["layer"] == maps.split + 1 + i and cert["lambda"] == maps.lambdas[i]
        assert cert["calibration_sha256"] == stats_digest(stats)
        assert cert["reg_eig_lower"] > 0 and cert["residual_rel"] < 1e-5
        result = check_certificate(cert, stats, maps)
        assert result.passed, result.failures
        record(NUMERIC)


@settings(max_examples=6)
@given(st.integers(0, len(CONFIGS) - 1), st.data(), st.sampled_from(["auto", 1e-6, 1e-2, 1.0, 1e3]))
def test_certify_cli_on_tiny_calibrations(index, data, lam):
    """``ridgefill certify`` on maps calibrated by the project on tiny models: one certificate per late
    layer, each passing the criterion and agreeing with a recomputation from the saved files."""
    split = data.draw(st.integers(0, CONFIGS[index][1] - 2), label="split")
    with tempfile.TemporaryDirectory() as tmp:
        check_all(*certify_cli(fitted_maps(index, split, lam), Path(tmp)))
    tally.example()


def test_certificates_reject_wrong_maps_and_tampering(tmp_path):
    """Maps solved without ``λ`` (but recording it), an edited certificate, and statistics of other
    maps are all caught."""
    maps = fitted_maps(0, 1, 1.0)
    certs, loaded, stats = certify_cli(maps, tmp_path)
    # maps solved with λ dropped, saved with the λ they claim
    ols = fit_maps(maps.stats, 1e-9)
    bad = RidgeMaps(maps.split, ols.weights.float(), ols.biases.float(), maps.lambdas, maps.meta, maps.stats)
    bad.save(tmp_path / "bad.safetensors")
    bad_certs = [read_certificate(p) for p in certify_maps(tmp_path / "bad.safetensors", tmp_path / "bad-certs")]
    late = [c for c in bad_certs if c["layer"] > maps.split + 1]  # layer S+1 has x = h_S: W = I either way
    assert late and all(not c["passed"] and not check_certificate(c).passed for c in late)
    # an edited certificate: numbers that no longer match the statistics, or a false verdict
    for key, value in (("residual_fro", certs[-1]["residual_fro"] / 2), ("lambda", 2.0), ("passed", False)):
        edited = dict(certs[-1], **{key: value})
        assert not check_certificate(edited, stats, loaded).passed, key
    # statistics of other maps beside these maps
    fitted_maps(0, 1, 1e3).save(tmp_path / "other.safetensors")
    with pytest.raises(CertificateError, match="other maps"):
        certify_maps(tmp_path / "maps.safetensors", tmp_path / "x", stats_file=stats_path(tmp_path / "other.safetensors"))
    tally.example(3)


@pytest.fixture(scope="module")
def real():
    return real_maps()


def test_real_model_certificates(real, tmp_path):
    """The real model: certificates for maps fitted on real text pass; slices of its statistics, in
    exact form, pass the exact checker, and the project's float solve lands on their exact minimiser."""
    check_all(*certify_cli(real, tmp_path))
    for index, lam in enumerate(real.lambdas):
        inst = instance_from_stats(f"s{index}", real.stats, index, lam)
        assert check_certificate(inst).passed
        record(EXACT)
        agrees_with_float_solve(inst)
    tally.example(len(real.lambdas))


def agrees_with_float_solve(inst: ExactInstance) -> None:
    """:func:`ridgefill.solve_ridge` on the instance's ``XᵀX``, ``XᵀY`` (float64) is within
    ``d · eps · κ`` of its exact minimiser."""
    x = torch.tensor([[float(v) for v in r] for r in inst.x], dtype=F64)
    y = torch.tensor([[float(v) for v in r] for r in inst.y], dtype=F64)
    w0 = torch.tensor([[float(v) for v in r] for r in inst.prior], dtype=F64)
    exact = torch.tensor([[float(v) for v in r] for r in inst.weight], dtype=F64)
    gram, lam = x.T @ x, float(inst.lam)
    w = solve_ridge(gram, x.T @ y, lam, prior=w0)
    d = gram.shape[0]
    kappa = condition(gram, lam)
    assert float((w - exact).norm()) <= 64 * d * EPS * kappa * (float(exact.norm()) + 1), kappa


rationals = st.fractions(min_value=-9, max_value=9, max_denominator=8)


@st.composite
def rational_instances(draw) -> ExactInstance:
    m, d, p = draw(st.integers(1, 8)), draw(st.integers(1, 4)), draw(st.integers(1, 2))
    x = draw(st.lists(st.lists(rationals, min_size=d, max_size=d), min_size=m, max_size=m))
    y = draw(st.lists(st.lists(rationals, min_size=p, max_size=p), min_size=m, max_size=m))
    lam = draw(st.one_of(st.just(Fraction(0)), st.fractions(min_value=Fraction(1, 1000), max_value=1000,
                                                             max_denominator=1000)))
    try:
        return solved_instance("hyp", x, y, lam, source="Rational data drawn by Hypothesis.")
    except ValueError:  # λ = 0 with a singular XᵀX: no unique solution to certify
        assume(False)


@given(rational_instances(), st.data())
def test_exact_certificates_from_rational_data(inst, data):
    """Exact instances on rational data drawn by Hypothesis: the exact minimiser passes the checker's
    mirror; a moved entry, a negative ``λ`` or a wrong shape fails it; the Lean text round-trips; and
    the project's float solve agrees with the exact minimiser to ``d · eps · κ``."""
    _, d, p = inst.shape
    assert check_certificate(inst).passed and check_exact(inst)
    i, j = data.draw(st.integers(0, d - 1), label="row"), data.draw(st.integers(0, p - 1), label="col")
    delta = data.draw(st.fractions(min_value=-1, max_value=1, max_denominator=10 ** 6).filter(bool), label="delta")
    w = [list(r) for r in inst.weight]
    w[i][j] += delta
    assert not check_exact(ExactInstance("moved", inst.x, inst.y, inst.prior, inst.lam, w))
    assert not check_exact(ExactInstance("neg", inst.x, inst.y, inst.prior, -1 - inst.lam, inst.weight))
    assert not check_exact(ExactInstance("short", inst.x, inst.y, inst.prior, inst.lam, inst.weight[:-1]))
    wrong = perturbed(inst, "wrong")
    assert not check_certificate(wrong).passed
    good, bad = parse_lean_certificates(lean_certificate_source([inst], wrong=[wrong]))
    assert good == [inst] and bad == [wrong]
    agrees_with_float_solve(inst)
    record(EXACT)
    tally.example()


def test_committed_lean_certificates(real):
    """``KvaLean/CertExamples.lean`` is what :mod:`crossval.lean_certs` generates: the same text from the
    instances it holds; its data instances exactly, its statistics slice within rounding of a fresh
    calibration; every accepted one passes the checker's mirror and every wrong one fails it (the CI
    Lean step runs the same checks in the kernel)."""
    text = LEAN_FILE.read_text(encoding="utf-8")
    good, wrong = parse_lean_certificates(text)
    assert text == lean_certificate_source(good, wrong=wrong, header=HEADER)
    fresh_good, fresh_wrong = build(real)
    assert [g.name for g in good] == [g.name for g in fresh_good] and len(wrong) == len(fresh_wrong)
    assert good[:2] == data_instances()
    assert wrong[0] == fresh_wrong[0]
    # the statistics slice: same λ, and X, Y within rounding of the fresh, unrounded slice
    committed = good[-1]
    index = SLICE["index"] % len(real.lambdas)
    x, y, lam = stats_slice(real.stats, index, real.lambdas[index], dims=SLICE["dims"], outputs=SLICE["outputs"])
    for mat, fresh in ((committed.x, x), (committed.y, y)):
        got = torch.tensor([[float(v) for v in r] for r in mat], dtype=F64)
        assert float((got - fresh).abs().max()) <= 0.5e-3 + 1e-9
    assert committed.lam == fresh_good[-1].lam and abs(float(committed.lam) - lam) <= 0.5e-3 + 1e-9
    for inst in good:
        assert check_exact(inst)
    for inst in wrong:
        assert not check_exact(inst)
    record(EXACT, len(good) + len(wrong))
    tally.example(len(good) + len(wrong))


def test_certificate_lean_example():
    """The example committed in ``KvaLean/Certificate.lean`` (checked there by the kernel): the Python
    mirror accepts ``exampleInstance`` and rejects ``badInstance``, and the project's exact solve of the
    same data reproduces its ``W`` exactly."""
    from crossval.lean_certs import lean_instances
    from crossval.registry import LEAN_DIR

    found = lean_instances((LEAN_DIR / "Certificate.lean").read_text(encoding="utf-8"))
    good, bad = found["exampleInstance"], found["badInstance"]
    assert check_certificate(good).passed and not check_certificate(bad).passed
    assert solved_instance("again", good.x, good.y, good.lam, prior=good.prior).weight == good.weight
    assert bad.weight != good.weight and (bad.x, bad.y, bad.lam) == (good.x, good.y, good.lam)
    agrees_with_float_solve(good)
    record(("KvaLean.exampleInstance_check", "KvaLean.exampleInstance_optimal"))
    record(("KvaLean.badInstance_rejected",))
    tally.example(2)


# --------------------------------------------------------------------------------------------------
# rigorous (ball-arithmetic) certificates: ridgefill certify --rigorous
# --------------------------------------------------------------------------------------------------

def _frac(t) -> list[list[Fraction]]:
    return [[Fraction(v) for v in row] for row in t.detach().to(F64).tolist()]


def _exact_problem(stats, index, weight, lam):
    """``A = ½(G + Gᵀ) + λI``, ``B + λW₀``, ``Σ‖x − x̄‖²``, ``W_s``, ``W₀``, ``½(G + Gᵀ)``, ``B`` and ``λ`` as
    exact rationals (``G``, ``B``: the float64 centred statistics the solve reads; ``J`` reads only the
    symmetric part of ``G``)."""
    from ridgefill.ridge import default_prior

    gram, cross, sxx = stats.centred(index)
    lam = Fraction(lam)
    g = _frac(gram)
    sym = [[(g[i][j] + g[j][i]) / 2 for j in range(len(g))] for i in range(len(g))]
    a = [list(r) for r in sym]
    for i in range(len(a)):
        a[i][i] += lam
    prior = _frac(default_prior(stats))
    rhs = [[b + lam * p for b, p in zip(rb, rp)] for rb, rp in zip(_frac(cross), prior)]
    return a, rhs, Fraction(float(sxx)), _frac(weight), prior, sym, _frac(cross), lam


def _residual(a, w, rhs):
    from ridgefill.certify import _matmul

    aw = _matmul(a, w)
    return [[u - v for u, v in zip(ru, rv)] for ru, rv in zip(aw, rhs)]


def _sq(m) -> Fraction:
    return sum((v * v for row in m for v in row), Fraction(0))


def _objective(gram, cross, sxx, lam, prior, w) -> Fraction:
    """``J(W) = ⟨W, G W⟩ − 2⟨W, B⟩ + Σ‖x − x̄‖² + λ‖W − W₀‖²`` exactly."""
    from ridgefill.certify import _matmul

    gw = _matmul(gram, w)
    inner = sum((u * v for ru, rv in zip(w, gw) for u, v in zip(ru, rv)), Fraction(0))
    wb = sum((u * v for ru, rv in zip(w, cross) for u, v in zip(ru, rv)), Fraction(0))
    return inner - 2 * wb + sxx + lam * _sq([[u - p for u, p in zip(ru, rp)] for ru, rp in zip(w, prior)])


def test_rigorous_certificate_encloses_exact_residual_and_gap(tmp_path):
    """On maps calibrated by the project (tiny model, ``d = 16``), read back from disk: the ball enclosure of
    ``‖(G + λI)W_s − (B + λW₀)‖_F`` holds the exact rational residual's norm and the float64 one (within its
    rounding); ``μ`` is below the spectrum; and the bounds are those of ``KvaLean.ridge_err_le_residual``
    (``μ²‖W_s − W★‖² ≤ ‖R‖²``) and ``KvaLean.ridge_gap`` (``J(W_s) − J(W★) = ⟨W_s − W★, A(W_s − W★)⟩``, at
    most the certified gap), checked against the exact minimiser ``W★`` (:func:`ridgefill.certify.exact_solve`)."""
    from ridgefill.certify import as_solved, exact_solve, rigorous_certify_maps, _matmul

    path = fitted_maps(1, 1, 1.0).save(tmp_path / "maps.safetensors")
    certs = rigorous_certify_maps(path)
    maps, stats = load_maps(path), load_stats(stats_path(path))[0]
    solved, weights = as_solved(stats, maps)
    assert [c["layer"] for c in certs] == [maps.split + 1 + i for i in range(len(maps.lambdas))]
    assert all(c["passed"] and c["reg_eig_lower"] > 0 for c in certs)
    index = len(maps.lambdas) - 1  # the last late layer: a map far from the identity
    cert, lam = certs[index], maps.lambdas[index]
    a, rhs, sxx, w, prior, gram, cross, lam_q = _exact_problem(solved, index, weights[index], lam)
    r_sq = _sq(_residual(a, w, rhs))
    lo, hi = Fraction(cert["residual_fro_lower"]), Fraction(cert["residual_fro_upper"])
    # the float64 residual, within its own rounding (d + 2) eps ‖|A||W| + |B + λW₀|‖_F
    g64, b64, _ = solved.centred(index)
    a64 = g64 + lam * torch.eye(g64.shape[0], dtype=F64)
    rhs64 = b64 + lam * torch.eye(*b64.shape, dtype=F64)
    w64 = weights[index].to(F64)
    r_float = float((a64 @ w64 - rhs64).norm())
    slack = (g64.shape[0] + 2) * EPS * float((a64.abs() @ w64.abs() + rhs64.abs()).norm())
    # the enclosure holds the exact residual, and is as wide as the float error analysis allows, no wider
    assert lo * lo <= r_sq <= hi * hi and 0 < lo and hi - lo <= 4 * Fraction(slack)
    assert cert["residual_fro_lower"] - slack <= r_float <= cert["residual_fro_upper"] + slack
    # μ ≤ λ_min(G + λI)
    assert 0 < cert["reg_eig_lower"] <= float(torch.linalg.eigvalsh(a64)[0])
    # the exact minimiser and the theorem's inequalities
    wstar = exact_solve(gram, cross, lam_q, prior)
    e = [[u - v for u, v in zip(ru, rv)] for ru, rv in zip(w, wstar)]
    mu = Fraction(cert["reg_eig_lower"])
    assert mu * mu * _sq(e) <= r_sq                                      # ridge_err_le_residual, all columns
    assert _sq(e) <= Fraction(cert["weight_error_bound"]) ** 2
    gap = _objective(gram, cross, sxx, lam_q, prior, w) - _objective(gram, cross, sxx, lam_q, prior, wstar)
    ae = _matmul(a, e)
    assert gap == sum((u * v for ru, rv in zip(e, ae) for u, v in zip(ru, rv)), Fraction(0))  # ridge_gap
    assert 0 <= gap <= Fraction(cert["excess_bound"])
    assert Fraction(cert["objective_lower"]) <= _objective(gram, cross, sxx, lam_q, prior, w) <= Fraction(
        cert["objective_upper"])
    # the bias (KvaLean.bias_err_le): b★ = x̄ − h̄ W★ exactly, for the float64 means the fit read
    mh, mx = solved.means()
    hbar, xbar = [Fraction(v) for v in mh.tolist()], [Fraction(v) for v in mx[index].tolist()]
    b_s = [Fraction(v) for v in maps.biases[index].double().tolist()]

    def intercept(m):
        return [xbar[c] - sum((hbar[i] * m[i][c] for i in range(len(hbar))), Fraction(0)) for c in range(len(xbar))]

    cons = sum(((u - v) ** 2 for u, v in zip(b_s, intercept(w))), Fraction(0))
    assert cons <= Fraction(cert["bias_residual_upper"]) ** 2 and cert["bias_passed"]
    assert sum(((u - v) ** 2 for u, v in zip(b_s, intercept(wstar))), Fraction(0)) <= Fraction(
        cert["bias_error_bound"]) ** 2
    record(NUMERIC + ("KvaLean.ridge_err_le_residual", "KvaLean.ridge_gap", "KvaLean.gram_err_le_residual",
                      "KvaLean.gram_gap", "KvaLean.gram_gap_le", "KvaLean.bias_err_le"), len(certs))
    tally.example()


def test_rigorous_certificate_rejects_a_planted_weight(tmp_path, capsys):
    """One stored weight moved by 10⁻² ``‖W‖_max`` (a gap of about 10⁻³ ``J``, above the criterion 10⁻⁴): the ball enclosure's residual and gap bound grow by
    orders of magnitude, the certificate fails with a message naming the gap, and ``ridgefill certify
    --rigorous`` exits with status 2."""
    from ridgefill.certify import as_solved, rigorous_certificate, rigorous_failures

    maps = fitted_maps(1, 1, 1.0)
    solved, weights = as_solved(maps.stats, maps)
    index = len(maps.lambdas) - 1
    good = rigorous_certificate(solved, index, weights[index], maps.lambdas[index])
    planted = weights[index].clone()
    planted[3, 5] += 1e-2 * float(planted.abs().max())
    bad = rigorous_certificate(solved, index, planted, maps.lambdas[index])
    assert good["passed"] and not bad["passed"]
    # a stored bias moved by 10⁻² ‖b‖_max: the weights pass, the bias does not (KvaLean.bias_err_le)
    bias = maps.biases[index].double()
    good_b = rigorous_certificate(solved, index, weights[index], maps.lambdas[index], bias=bias)
    moved = bias.clone()
    moved[2] += 1e-2 * float(moved.abs().max())
    bad_b = rigorous_certificate(solved, index, weights[index], maps.lambdas[index], bias=moved)
    assert good_b["passed"] and good_b["bias_passed"] and not bad_b["passed"] and not bad_b["bias_passed"]
    assert bad_b["bias_residual_upper"] > 1e3 * good_b["bias_residual_upper"]
    (msg_b,) = rigorous_failures(bad_b)
    assert msg_b.startswith("the stored bias is") and "recalibrate" in msg_b
    assert bad["residual_fro_lower"] > 1e3 * good["residual_fro_upper"]
    assert bad["excess_bound"] > 1e6 * good["excess_bound"]
    (msg,) = rigorous_failures(bad)
    assert "objective gap" in msg and "recalibrate" in msg
    # through the command: the fitted maps pass and their bounds are written; maps saved with the planted
    # weight (and statistics written with them) fail
    maps.save(tmp_path / "good.safetensors")
    assert cli.main(["certify", str(tmp_path / "good.safetensors"), "--rigorous"]) == 0
    written = json.loads((tmp_path / "good.certs" / "rigorous.json").read_text())
    assert [c["layer"] for c in written] == [maps.split + 1 + i for i in range(len(maps.lambdas))]
    assert written[index]["excess_bound"] == good["excess_bound"] and all(c["passed"] for c in written)
    assert "rigorous certificates:" in capsys.readouterr().out
    w_all = maps.weights.clone()
    w_all[index] = planted.to(w_all.dtype)
    RidgeMaps(maps.split, w_all, maps.biases, maps.lambdas, maps.meta, maps.stats).save(tmp_path / "bad.safetensors")
    assert cli.main(["certify", str(tmp_path / "bad.safetensors"), "--rigorous"]) == 2
    err = capsys.readouterr().err
    assert f"layer {maps.split + 1 + index}" in err and "objective gap" in err
    tally.example()


def test_rigorous_certificate_on_the_real_model(real, tmp_path):
    """The real model's maps (``d = 576``): the ball-arithmetic certificate passes on the first and the last
    late layer, the last with a gap bound far inside the criterion (all layers: ``ridgefill certify
    --rigorous``, docs/kvalean.md)."""
    from ridgefill.certify import rigorous_certify_maps

    path = real.save(tmp_path / "maps.safetensors")
    last = len(real.lambdas) - 1
    certs = rigorous_certify_maps(path, layers=[0, last])
    assert [c["layer"] for c in certs] == [real.split + 1, real.split + 1 + last]
    for c in certs:
        assert c["passed"] and c["reg_eig_lower"] > 0
        assert c["excess_bound"] <= c["max_excess_rel"] * c["objective_lower"] + c["storage_floor_upper"]
    # layer S + 1 reads x = h_S (J(W★) ≈ 0: only the float32 allowance covers it); the last layer, far inside
    assert certs[1]["excess_rel_upper"] < 1e-8, certs[1]
    record(NUMERIC + ("KvaLean.ridge_err_le_residual", "KvaLean.ridge_gap"), 2)
    tally.example(2)
