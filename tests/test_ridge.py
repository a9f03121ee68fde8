"""The closed-form fit: against a least-squares solve, its limits, its statistics and its errors."""

import pytest
import torch

from ridgefill import InputError, RidgeStats, SingularGramError, fit_maps, solve_ridge
from ridgefill.ridge import heldout_errors

F64 = torch.float64


def data(n=200, d=6, layers=3, seed=0, offset=5.0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=F64) + offset
    w = torch.randn(layers, d, d, generator=g, dtype=F64) * 0.3 + torch.eye(d, dtype=F64)
    xs = torch.einsum("nd,lde->lne", h, w) + torch.randn(layers, n, d, generator=g, dtype=F64) * 0.5 + 2.0
    return h, xs


def stats_of(h, xs, parts=1):
    st = RidgeStats(xs.shape[0], h.shape[1])
    for idx in torch.arange(h.shape[0]).chunk(parts):
        st.update(h[idx], xs[:, idx])
    return st


def augmented_lstsq(h, x, lam):
    """argmin ‖[H 1][W; b] − X‖² + λ‖W − I‖² as one least-squares problem on stacked rows."""
    n, d = h.shape
    top = torch.cat([h, torch.ones(n, 1, dtype=F64)], 1)
    bottom = torch.cat([lam ** 0.5 * torch.eye(d, dtype=F64), torch.zeros(d, 1, dtype=F64)], 1)
    a = torch.cat([top, bottom])
    y = torch.cat([x, lam ** 0.5 * torch.eye(d, dtype=F64)])
    sol = torch.linalg.lstsq(a, y, driver="gelsd").solution
    return sol[:d], sol[d]


@pytest.mark.parametrize("lam", [0.0, 1e-3, 1.0, 50.0, 1e4])
def test_fit_equals_augmented_least_squares(lam):
    h, xs = data()
    fitted = fit_maps(stats_of(h, xs, parts=4), lam)
    for layer in range(xs.shape[0]):
        w, b = augmented_lstsq(h, xs[layer], lam)
        torch.testing.assert_close(fitted.weights[layer], w, rtol=0, atol=1e-8)
        torch.testing.assert_close(fitted.biases[layer], b, rtol=0, atol=1e-7)


def test_large_lambda_gives_identity():
    h, xs = data()
    st = stats_of(h, xs)
    dists = [float((fit_maps(st, lam).weights - torch.eye(6, dtype=F64)).norm()) for lam in (1e2, 1e4, 1e6, 1e8)]
    assert dists == sorted(dists, reverse=True)
    assert dists[-1] < 1e-4
    assert dists[0] > 0.1


def test_targets_equal_inputs_give_identity_for_any_lambda():
    h, _ = data()
    xs = h[None].repeat(2, 1, 1)
    for lam in (1e-6, 1.0, 1e3):
        fitted = fit_maps(stats_of(h, xs), lam)
        torch.testing.assert_close(fitted.weights, torch.eye(6, dtype=F64).expand(2, 6, 6), rtol=0, atol=1e-9)
        torch.testing.assert_close(fitted.biases, torch.zeros(2, 6, dtype=F64), rtol=0, atol=1e-8)


def test_streaming_and_merging_match_one_pass():
    h, xs = data(seed=3)
    one = stats_of(h, xs)
    many = stats_of(h, xs, parts=7)
    a, b = stats_of(h[:90], xs[:, :90]), stats_of(h[90:] * 1.0, xs[:, 90:])
    merged = a.merged(b)
    for st in (many, merged):
        for layer in range(3):
            for u, v in zip(st.centred(layer), one.centred(layer)):
                torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-8)


def test_statistics_memory_does_not_grow_with_tokens():
    h, xs = data(n=100)
    st = stats_of(h, xs)
    size = sum(t.numel() for t in (st.sum_h, st.gram, st.sum_x, st.cross, st.sq_x))
    h2, xs2 = data(n=5000)
    st2 = stats_of(h2, xs2, parts=10)
    assert size == sum(t.numel() for t in (st2.sum_h, st2.gram, st2.sum_x, st2.cross, st2.sq_x))


def test_heldout_errors_equal_direct_residuals():
    h, xs = data(seed=4)
    fit, held = stats_of(h[:150], xs[:, :150]), stats_of(h[150:], xs[:, 150:])
    lams = torch.tensor([1e-3, 1.0, 30.0], dtype=F64)
    for layer in range(3):
        got = heldout_errors(fit, held, layer, lams)
        for lam, e in zip(lams.tolist(), got):
            m = fit_maps(fit, lam)
            pred = h[150:] @ m.weights[layer] + m.biases[layer]
            torch.testing.assert_close(e, (xs[layer, 150:] - pred).square().sum(), rtol=1e-8, atol=1e-8)


def test_auto_lambda_picks_the_best_grid_point_and_beats_identity():
    h, xs = data(n=400, seed=5)
    fit, held = stats_of(h[:300], xs[:, :300]), stats_of(h[300:], xs[:, 300:])
    m = fit_maps(fit, "auto", held)
    assert len(m.lambdas) == 3 and all(lam > 0 for lam in m.lambdas)
    assert all(r < ri for r, ri in zip(m.heldout_rel_error, m.heldout_rel_error_identity))


def test_errors():
    h, xs = data(n=3, d=6)  # fewer rows than dimensions: singular Gram
    st = stats_of(h, xs)
    with pytest.raises(SingularGramError, match="λ > 0"):
        fit_maps(st, 0.0)
    fit_maps(st, 1e-3)  # any λ > 0 is fine
    with pytest.raises(InputError, match="≥ 0"):
        solve_ridge(torch.eye(3), torch.eye(3), -1.0)
    with pytest.raises(InputError, match="held-out"):
        fit_maps(st, "auto")
    with pytest.raises(InputError, match="no calibration rows"):
        fit_maps(RidgeStats(2, 4), 1.0)
    with pytest.raises(InputError, match="list of 3"):
        fit_maps(st, [1.0])
    bad = torch.full((5, 6), float("nan"), dtype=F64)
    from ridgefill import NonFiniteError
    with pytest.raises(NonFiniteError):
        RidgeStats(3, 6).update(bad, torch.zeros(3, 5, 6))


def test_solve_and_certificates_do_not_depend_on_the_thread_count():
    """A multi-threaded BLAS sums in an order that depends on the thread count, which moves a float64
    solve by about κ·eps and flips the float32 rounding of entries near a midpoint. ``fit_maps``' solves
    and the certificates run on one thread (``ridge.one_thread``): maps fitted with 2 threads are the bits
    fitted with 1, their certificates pass and agree whichever thread count checks them, and the
    caller's thread count is restored."""
    from ridgefill.certify import layer_certificate

    g = torch.Generator().manual_seed(3)
    n, d = 3000, 576
    h = torch.randn(n, d, generator=g, dtype=F64) @ (torch.randn(d, d, generator=g, dtype=F64) / d ** 0.5)
    xs = torch.stack([h + 0.3 * torch.randn(n, d, generator=g, dtype=F64) for _ in range(2)])
    stats = stats_of(h, xs)
    before = torch.get_num_threads()
    fits, certs = {}, {}
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            fits[threads] = fit_maps(stats, 1e-3)
            assert torch.get_num_threads() == threads
        for threads in (1, 2):  # the 2-thread maps certified by a 1-thread and a 2-thread process
            torch.set_num_threads(threads)
            certs[threads] = [layer_certificate(stats, i, fits[2].weights[i].float(), 1e-3) for i in range(2)]
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert torch.equal(fits[2].weights, fits[1].weights)
    for a, b in zip(certs[1], certs[2]):
        assert a["passed"] and a["storage_is_rounding"], a
        assert a == b
