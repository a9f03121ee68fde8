"""Property test of ``KvaLean.Decoder.fill_err_le`` (``KvaLean/Stability.lean``) with fill errors ``δ > 0``.

The theorem bounds the filled model's error through Lipschitz layers: with cache maps ``K_c``-Lipschitz,
layers ``K_x``-Lipschitz in the row's input and ``K_a``-Lipschitz in the cache entries it reads, and every
filled row's predicted late-layer input within ``δ`` of the exact one, every layer input is within ``B_l``
and every cache entry within ``K_c (B_l + δ)`` of the exact model's, ``B₀ = 0``,
``B_{l+1} = K_x B_l + K_a K_c (B_l + δ)``.

A transformer's softmax attention has no simple global Lipschitz constant, so the model here is a tiny
decoder whose constants are computable, with the project's own pieces where the fill has them:

- the cache entry of row ``p`` at layer ``l`` is ``RoPE_p(K_l x)`` (:func:`ridgefill.adapters.base.apply_rope`,
  a rotation, so ``K_c = max_l ‖K_l‖₂``);
- layer ``l`` at row ``t`` is ``x (I + A_l)ᵀ + mean_{j ≤ t}(c_j) M_lᵀ``: a residual linear map and a
  uniform causal attention over the cache entries of rows ``0..t`` (``K_x = max_l ‖I + A_l‖₂``,
  ``K_a = max_l ‖M_l‖₂``, since a mean of differences each at most ``e`` is at most ``e``);
- the maps are fitted by :func:`ridgefill.fit_maps` on :class:`ridgefill.RidgeStats` of calibration prompts
  run through the exact model, and filled rows predict with :func:`ridgefill.predict_inputs`; the exact
  rows are :func:`ridgefill.exact_positions` (tail and exact rows).

The fill errors are not zero (``x_l`` is not a function of ``h_S`` alone: it reads the earlier rows), so
``δ`` is measured, the bound computed, and every input and cache entry of the filled model compared with
it (float64; slack ``10⁻⁹`` relative).
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from ridgefill import RidgeStats, exact_positions, fit_maps, predict_inputs
from ridgefill.adapters.base import Rope, apply_rope

from crossval import tally

F64 = torch.float64
VOCAB = 13
SLACK = 1e-9


class LinearDecoder:
    """The tiny decoder of the module docstring: ``layers`` layers, width ``d``, cache width ``k`` (even)."""

    def __init__(self, seed: int, layers: int, d: int, k: int, scale: float):
        g = torch.Generator().manual_seed(seed)
        self.layers, self.d, self.k = layers, d, k
        self.embed = torch.randn(VOCAB, d, generator=g, dtype=F64)
        self.K = torch.randn(layers, k, d, generator=g, dtype=F64) * scale
        self.A = torch.randn(layers, d, d, generator=g, dtype=F64) * scale
        self.M = torch.randn(layers, d, k, generator=g, dtype=F64) * scale

    def rope(self, positions: torch.Tensor) -> Rope:
        """RoPE tables ``[1, rows, k]`` (``θ_i = 10000^(−2i/k)``, halves layout of ``rotate_half``)."""
        inv = 10000.0 ** (-torch.arange(0, self.k, 2, dtype=F64) / self.k)
        ang = positions.to(F64)[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)[None]
        return Rope(ang.cos(), ang.sin())

    def cache(self, layer: int, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        """``RoPE_p(K_l x)`` for rows ``x`` ``[rows, d]`` at the positions of ``rope``: ``[rows, k]``."""
        return apply_rope((x @ self.K[layer].T)[None, None], rope)[0, 0]

    def layer(self, layer: int, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Every row ``t`` of ``x`` ``[N, d]`` with the cache entries ``c`` ``[N, k]`` of rows ``0..t``."""
        means = c.cumsum(0) / torch.arange(1, c.shape[0] + 1, dtype=F64)[:, None]
        return x + x @ self.A[layer].T + means @ self.M[layer].T

    def constants(self) -> tuple[float, float, float]:
        """``(K_x, K_a, K_c)``: the largest spectral norms over the layers."""
        eye = torch.eye(self.d, dtype=F64)
        kx = max(float(torch.linalg.matrix_norm(eye + a, ord=2)) for a in self.A)
        ka = max(float(torch.linalg.matrix_norm(m, ord=2)) for m in self.M)
        kc = max(float(torch.linalg.matrix_norm(k, ord=2)) for k in self.K)
        return kx, ka, kc

    def exact(self, tokens: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The exact model: layer inputs ``x_0..x_L`` and cache entries ``c_0..c_{L−1}``, each ``[N, ·]``."""
        rope = self.rope(torch.arange(tokens.numel()))
        xs, cs = [self.embed[tokens]], []
        for layer in range(self.layers):
            cs.append(self.cache(layer, xs[-1], rope))
            xs.append(self.layer(layer, xs[-1], cs[-1]))
        return xs, cs

    def filled(self, tokens: torch.Tensor, split: int, filled: torch.Tensor, maps) -> tuple[list, list, float]:
        """The filled model (Lean ``fillInput``/``fillCache``): for ``l > S`` a filled row's entry is
        ``cache_l(x̂_l)``, ``x̂_l = predict_inputs(h_S, W_l, b_l)``; every row attends to the mixed cache.
        Also returns ``δ = max ‖x̂_l − x_l‖`` over filled rows and late layers (exact ``x_l``)."""
        rope = self.rope(torch.arange(tokens.numel()))
        exact_xs, _ = self.exact(tokens)
        h = exact_xs[split + 1]
        xs, cs, delta = [self.embed[tokens]], [], 0.0
        for layer in range(self.layers):
            c = self.cache(layer, xs[-1], rope)
            if layer > split and bool(filled.any()):
                i = layer - split - 1
                x_hat = predict_inputs(h[None, filled], maps.weights[i], maps.biases[i])[0]
                c[filled] = self.cache(layer, x_hat, Rope(rope.cos[:, filled], rope.sin[:, filled]))
                delta = max(delta, float((x_hat - exact_xs[layer][filled]).norm(dim=-1).max()))
            cs.append(c)
            xs.append(self.layer(layer, xs[-1], c))
        return xs, cs, delta


def err_bound(kx: float, ka: float, kc: float, delta: float, layers: int) -> list[float]:
    """Lean ``errBound``: ``B₀ = 0``, ``B_{l+1} = K_x B_l + K_a K_c (B_l + δ)``, for ``l = 0..layers``."""
    out = [0.0]
    for _ in range(layers):
        out.append(kx * out[-1] + ka * (kc * (out[-1] + delta)))
    return out


@given(st.integers(0, 2 ** 31), st.integers(3, 6), st.sampled_from([4, 6, 8]), st.integers(4, 24), st.data())
def test_fill_error_within_lipschitz_bound(seed, layers, d, n, data):
    """``fill_err_le`` with ``δ > 0``: every layer input of the filled model within ``B_l`` of the exact
    one and every cache entry within ``K_c (B_l + δ)``, at every row (exact and filled), with ``δ`` the
    measured fill error of maps fitted by ``ridgefill.fit_maps``; the errors are not zero."""
    split = data.draw(st.integers(0, layers - 2), label="split")
    tail = data.draw(st.integers(1, n - 1), label="tail")
    exact_rows = data.draw(st.lists(st.integers(1, n - 1), max_size=3, unique=True), label="exact rows")  # row 0 filled
    lam = data.draw(st.sampled_from([1e-3, 1.0, 100.0]), label="lambda")
    model = LinearDecoder(seed, layers, d, 4, scale=0.4)
    g = torch.Generator().manual_seed(seed + 1)
    stats = RidgeStats(layers - split - 1, d)
    for _ in range(6):  # calibration: 6 prompts of 32 rows through the exact model
        xs, _ = model.exact(torch.randint(0, VOCAB, (32,), generator=g))
        stats.update(xs[split + 1], torch.stack(xs[split + 1:layers]))  # h_S; the late layers' inputs x_{S+1}..x_{L-1}
    maps = fit_maps(stats, lam)
    tokens = torch.randint(0, VOCAB, (n,), generator=g)
    filled = torch.ones(n, dtype=torch.bool)
    filled[exact_positions(n, tail, exact_rows)] = False
    exact_xs, exact_cs = model.exact(tokens)
    xs, cs, delta = model.filled(tokens, split, filled, maps)
    kx, ka, kc = model.constants()
    bound = err_bound(kx, ka, kc, delta, layers)
    assert delta > 0  # the fill errs: the bound is used with δ > 0
    worst = 0.0
    for layer in range(layers + 1):
        err = float((xs[layer] - exact_xs[layer]).norm(dim=-1).max())
        assert err <= bound[layer] * (1 + SLACK) + SLACK, (layer, err, bound[layer])
        worst = max(worst, err)
        if layer < layers:
            err_c = float((cs[layer] - exact_cs[layer]).norm(dim=-1).max())
            assert err_c <= kc * (bound[layer] + delta) * (1 + SLACK) + SLACK, (layer, err_c, kc, bound[layer], delta)
    last = (~filled).nonzero().flatten()  # the exact rows, the last one among them
    assert float((xs[layers][last] - exact_xs[layers][last]).norm(dim=-1).max()) <= bound[layers] * (1 + SLACK) + SLACK
    assert worst > 0  # filled rows' errors reach the exact rows' later layers
    tally.example()
