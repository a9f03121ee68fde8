"""Cost model of exact and fill prefill: FLOPs and bytes of weights read, from a model config.

Pure arithmetic (no tensors, no model): it counts what an ideal implementation must compute, so the
ratio ``exact / fill`` is the speed-up a perfect fill path would reach when prefill is compute-bound
(long prompts). ``ridgefill bench`` prints it next to the measured ratio.

Units: FLOPs count one multiply-add as 2 FLOPs; bytes are bytes. Notation: ``d`` hidden size, ``H``
query heads, ``H_kv`` KV heads, ``h`` head dim, ``I`` MLP intermediate size, ``V`` vocabulary, ``L``
layers, ``N`` prompt rows, ``S`` split, ``T`` exact tail rows, ``F = N - T`` filled rows.

Per row and layer (dense Llama-style decoder layer, gated MLP)::

    projections  = 2·d·(H·h) [q] + 2·2·d·(H_kv·h) [k, v] + 2·(H·h)·d [o]
    mlp          = 2·3·d·I            (gate, up, down; 2·2·d·I for a non-gated MLP)
    attention(c) = 2·2·H·h·c          (q·kᵀ and p·v over the c = p + 1 keys a row at position p sees)

Causal attention over rows ``a..b-1`` costs ``4·H·h·Σ_{p=a}^{b-1} (p+1)``. Exact prefill::

    exact = L·(N·(projections + mlp) + attention over rows 0..N-1) + lm_head

Fill prefill (layers ``0..S`` exact on every row; each late layer ``l = S+1..L-1`` has ``F`` filled rows
that compute only the map and K/V, and ``T`` exact rows that run the whole layer over the mixed cache)::

    fill = (S+1)·(N·(projections + mlp) + attention over 0..N-1)
         + (L-S-1)·(F·(maps + kv) + T·(projections + mlp) + attention over rows N-T..N-1)
         + lm_head
    maps = 2·d·d + d     (x̂ = h_S·W_l + b_l; 0 for the identity fill)
    kv   = 2·2·d·(H_kv·h)
    lm_head = 2·d·V      (the last row only, in both paths)

Hybrid models (Qwen3-Next, Qwen3.5: ``layer_types`` with ``"linear_attention"``): a linear-attention (Gated
DeltaNet) layer has no K/V and no causal attention; per row, with ``H_k``, ``H_v`` key and value heads of
``h_k``, ``h_v`` (``K = H_k·h_k``, ``V = H_v·h_v``) and a convolution of width ``c``::

    linear_in   = 2·d·(2K + 2V + 2·H_v) [in_proj_qkvz, in_proj_ba] + 2·c·(2K + V) [conv]
    linear_out  = 2·V·d               [out_proj]
    recurrence  = 6·H_v·h_k·h_v       (the delta rule: read the state, update it, read the output)

and counts ``N·(linear_in + linear_out + recurrence + mlp)`` in the exact prefill. In the fill, a late
linear-attention layer's filled rows compute the map, ``linear_in`` and the recurrence (they advance the conv
and recurrent states; the kernel's outputs come with it), and its exact rows all of it; a full-attention layer
is counted as above, with the query projection doubled where the layer has an output gate
(``attn_output_gate``: ``q_proj`` gives a query and a gate per head). Recurrence FLOPs are counted under
``attention``, the convolution under ``projections``; the KV cache is that of the full-attention layers.
Row selection and K/V maps are not defined for hybrids (their exact rows are a tail: ``ridgefill.adapters.HybridAdapter``).

Norms, RoPE, SiLU, residual adds and softmax are linear in ``N`` with small constants and are left out
(they are < 1 % of the FLOPs of a Llama layer); the embedding lookup is a gather, 0 FLOPs.

Bytes of weights read assume every weight is read once per prefill (true for batched prefill):
each layer's projections, MLP and norms, the final norm, the LM head (``d·V``) and the ``N`` embedding
rows gathered; the fill path also reads its maps, ``(L-S-1)·(d·d + d)`` values. Both paths write the
same KV cache, ``2·L·N·H_kv·h`` values (:attr:`PrefillCost.kv_cache_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InputError
from .validate import check_context

__all__ = ["ModelShape", "PrefillCost", "exact_cost", "fill_cost", "ideal_ratio"]


@dataclass(frozen=True)
class ModelShape:
    """The sizes the cost model needs (see the module docstring for the notation).

    Attributes:
        layers: ``L``; hidden: ``d``; heads: ``H``; kv_heads: ``H_kv``; head_dim: ``h``;
        intermediate: ``I``; vocab: ``V``; gated_mlp: three MLP matrices (Llama) instead of two.
        linear_layers: indices of the linear-attention layers of a hybrid model (empty: every layer is
            attention); linear_key_heads, linear_value_heads, linear_key_dim, linear_value_dim, linear_conv:
            ``H_k``, ``H_v``, ``h_k``, ``h_v``, ``c`` of those layers; attn_output_gate: the attention layers'
            query projection also gives an output gate per head (module docstring).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated_mlp: bool = True
    linear_layers: tuple[int, ...] = ()
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv: int = 0
    attn_output_gate: bool = False

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"model shape {name}={value!r} must be a positive integer")
        lin = self.linear_layers
        if not isinstance(lin, tuple) or len(set(lin)) != len(lin) or any(
                not isinstance(i, int) or not 0 <= i < self.layers for i in lin):
            raise InputError(f"linear_layers={lin!r} must be a tuple of distinct layer indices 0..{self.layers - 1}")
        if lin:
            for name in ("linear_key_heads", "linear_value_heads", "linear_key_dim", "linear_value_dim", "linear_conv"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise InputError(f"model shape {name}={value!r} must be a positive integer (the model has "
                                     "linear-attention layers)")
        if self.heads % self.kv_heads:
            raise InputError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads} (grouped-query attention)")

    @classmethod
    def from_config(cls, config) -> "ModelShape":
        """Read the shape from a ``transformers`` config (Llama-style field names; gated MLP).

        Raises:
            InputError: a needed field (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
                ``intermediate_size``, ``vocab_size``) is missing or not a positive integer.
        """
        def need(name):
            value = getattr(config, name, None)
            if value is None:
                raise InputError(f"the model config has no {name!r}: the cost model needs a Llama-style config "
                                 "(num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, vocab_size)")
            return value

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        types = list(getattr(config, "layer_types", None) or [])
        linear = tuple(i for i, t in enumerate(types) if t == "linear_attention")
        hybrid = {}
        if linear:  # Qwen3-Next / Qwen3.5 (transformers' field names); their attention layers have an output gate
            hybrid = dict(linear_layers=linear, linear_key_heads=need("linear_num_key_heads"),
                          linear_value_heads=need("linear_num_value_heads"), linear_key_dim=need("linear_key_head_dim"),
                          linear_value_dim=need("linear_value_head_dim"), linear_conv=need("linear_conv_kernel_dim"),
                          attn_output_gate=bool(getattr(config, "attn_output_gate", True)))
        return cls(layers=need("num_hidden_layers"), hidden=hidden, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim,
                   intermediate=need("intermediate_size"), vocab=need("vocab_size"), gated_mlp=True, **hybrid)

    # --- per-row pieces (FLOPs) -------------------------------------------------------------
    @property
    def kv_flops(self) -> int:
        """K and V projections of one row: ``2·2·d·H_kv·h``."""
        return 4 * self.hidden * self.kv_heads * self.head_dim

    @property
    def projection_flops(self) -> int:
        """Q, K, V and O projections of one row of an attention layer (Q twice as wide with an output gate)."""
        q_o = (3 if self.attn_output_gate else 2) * 2 * self.hidden * self.heads * self.head_dim
        return q_o + self.kv_flops

    @property
    def linear_in_flops(self) -> int:
        """A linear-attention layer's input projections and convolution for one row (module docstring)."""
        k, v = self.linear_key_heads * self.linear_key_dim, self.linear_value_heads * self.linear_value_dim
        return 2 * self.hidden * (2 * k + 2 * v + 2 * self.linear_value_heads) + 2 * self.linear_conv * (2 * k + v)

    @property
    def linear_out_flops(self) -> int:
        """A linear-attention layer's output projection for one row: ``2·V·d``."""
        return 2 * self.linear_value_heads * self.linear_value_dim * self.hidden

    @property
    def recurrence_flops(self) -> int:
        """The delta rule for one row of a linear-attention layer: ``6·H_v·h_k·h_v``."""
        return 6 * self.linear_value_heads * self.linear_key_dim * self.linear_value_dim

    def linear_count(self, first: int, stop: int) -> int:
        """How many of layers ``first..stop-1`` are linear-attention layers."""
        return sum(first <= i < stop for i in self.linear_layers)

    @property
    def mlp_flops(self) -> int:
        """The MLP of one row: ``2·3·d·I`` (gated) or ``2·2·d·I``."""
        return 2 * (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def map_flops(self) -> int:
        """One row's map ``h_S·W_l + b_l``: ``2·d·d + d``."""
        return 2 * self.hidden * self.hidden + self.hidden

    def attention_flops(self, first: int, stop: int) -> int:
        """Causal attention of the rows at positions ``first..stop-1`` over keys ``0..p``:
        ``4·H·h·Σ_{p=first}^{stop-1} (p+1)``."""
        keys = (stop * (stop + 1) - first * (first + 1)) // 2
        return 4 * self.heads * self.head_dim * keys

    # --- per-model pieces (values, not bytes) ------------------------------------------------
    @property
    def layer_params(self) -> int:
        """Weights of one attention layer: projections, MLP and the two norms."""
        proj = ((3 if self.attn_output_gate else 2) * self.hidden * self.heads * self.head_dim
                + 2 * self.hidden * self.kv_heads * self.head_dim)
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return proj + mlp + 2 * self.hidden

    @property
    def linear_layer_params(self) -> int:
        """Weights of one linear-attention layer: projections, convolution, gates, gated norm, MLP, two norms."""
        k, v, hv = (self.linear_key_heads * self.linear_key_dim, self.linear_value_heads * self.linear_value_dim,
                    self.linear_value_heads)
        mixer = self.hidden * (2 * k + 2 * v + 2 * hv) + self.linear_conv * (2 * k + v) + v * self.hidden + 2 * hv
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return mixer + self.linear_value_dim + mlp + 2 * self.hidden


@dataclass(frozen=True)
class PrefillCost:
    """The cost of one prefill.

    Attributes:
        flops: total FLOPs (multiply-add = 2).
        weight_bytes: bytes of weights (and maps) read, at ``bytes_per_value`` each.
        kv_cache_bytes: bytes of K/V written to the cache.
        parts: FLOPs by kind: ``projections``, ``mlp``, ``attention``, ``maps``, ``lm_head``.
    """

    flops: int
    weight_bytes: int
    kv_cache_bytes: int
    parts: dict[str, int] = field(default_factory=dict)


def _check_sizes(shape: ModelShape, n: int, split: int | None = None, tail: int | None = None,
                 bytes_per_value: int = 2) -> None:
    if not isinstance(n, int) or n < 1:
        raise InputError(f"prompt length N={n!r} must be a positive integer")
    if not isinstance(bytes_per_value, int) or bytes_per_value < 1:
        raise InputError(f"bytes_per_value={bytes_per_value!r} must be a positive integer (2 for bf16, 4 for float32)")
    if split is not None and not 0 <= split <= shape.layers - 2:
        raise InputError(f"split S={split} is out of range: a {shape.layers}-layer model needs 0 ≤ S ≤ {shape.layers - 2}")
    if tail is not None and not 1 <= tail <= n:
        raise InputError(f"tail T={tail} must be between 1 and the prompt length N={n}")


def _finish(shape: ModelShape, n: int, parts: dict[str, int], extra_params: int, bytes_per_value: int) -> PrefillCost:
    linear = len(shape.linear_layers)
    params = ((shape.layers - linear) * shape.layer_params + linear * shape.linear_layer_params + shape.hidden
              + shape.hidden * shape.vocab + n * shape.hidden)
    kv = 2 * (shape.layers - linear) * n * shape.kv_heads * shape.head_dim
    return PrefillCost(flops=sum(parts.values()), weight_bytes=(params + extra_params) * bytes_per_value,
                       kv_cache_bytes=kv * bytes_per_value, parts=parts)


def exact_cost(shape: ModelShape, n: int, *, bytes_per_value: int = 2) -> PrefillCost:
    """Cost of the exact prefill of ``n`` rows (last-row logits).

    Args:
        shape: the model (:meth:`ModelShape.from_config`).
        n: prompt rows ``N ≥ 1``.
        bytes_per_value: bytes per weight/cache value (2 for bf16, 4 for float32).

    Raises:
        InputError: ``n`` or ``bytes_per_value`` not a positive integer.
    """
    _check_sizes(shape, n, bytes_per_value=bytes_per_value)
    L, lin = shape.layers, len(shape.linear_layers)
    parts = {"projections": (L - lin) * n * shape.projection_flops + lin * n * (shape.linear_in_flops
                                                                               + shape.linear_out_flops),
             "mlp": L * n * shape.mlp_flops,
             "attention": (L - lin) * shape.attention_flops(0, n) + lin * n * shape.recurrence_flops,
             "maps": 0, "lm_head": 2 * shape.hidden * shape.vocab}
    return _finish(shape, n, parts, 0, bytes_per_value)


def fill_cost(shape: ModelShape, n: int, split: int, tail: int, *, maps: bool = True,
              bytes_per_value: int = 2, selected=(), rounds: int = 1, kv_maps: bool = False,
              queries: int = 1, context: int = 0, predicted: bool = False) -> PrefillCost:
    """Cost of the fill prefill of ``n`` rows at split ``S = split`` with ``T = tail`` exact rows.

    Args:
        shape: the model.
        n: prompt rows ``N``.
        split: ``S``, ``0 ≤ S ≤ L-2``.
        tail: exact rows ``T``, ``1 ≤ T ≤ N`` (the last ``T`` rows).
        maps: count the maps (``False``: the identity fill, which has none).
        bytes_per_value: bytes per weight/map/cache value.
        selected: positions of the rows a row selection made exact (``prefill(...,
            select=...)``, :attr:`ridgefill.fill.PrefillResult.selected`), all ``< N − T``. Selection
            runs the late layers ``rounds + 1`` times: pass 1 for the ``T`` tail rows (plus, per round, one
            attention row per query row for the scores, counted as one more attention row), then each
            later pass for the tail and every chosen row (an upper bound for ``rounds > 1``, where early
            passes have fewer chosen rows). Every filled row's map and K/V are computed once, in pass 1
            (the chosen rows' too).
        rounds: selection rounds (with ``selected``); ``0``: the rows were chosen before the late layers
            from the prompt alone (``Select(by="leverage")``) or from the token ids (``by="ngram"``): one
            pass with the tail and the chosen rows exact, plus the leverage scores (a ``d × d`` solve and
            ``2·d²`` FLOPs per row; counted for n-gram parts too, which need no multiply: a bound that is
            a little low for them, 0.3 % of the fill at 2,048 rows on SmolLM2).
        predicted: with ``rounds = 0``, the rows were chosen by one-pass parts (``by="predicted"``): every row's
            map and K/V are computed (the tail's and the chosen rows' too, which their exact pass then
            overwrites), and the ``queries`` scoring rows cost, per late layer, a map, a query projection
            (``2·d·H·h``) and one attention row of the last position (an upper bound, as for two passes);
            no leverage scores.
        queries: rows whose attention scores the filled rows per round (``Select.queries +
            Select.reference``; for a :class:`~ridgefill.select.Selection` the sum over its attention
            parts, :attr:`~ridgefill.select.Selection.queries`; at most the exact rows, ``tail`` plus the
            chosen rows, are scored, and the count is capped there), each counted as
            one more attention row of the last position in every late layer (an upper bound: the
            scoring runs only in layers with a kept head).
        kv_maps: K/V maps (kind ``"kv"``): each filled row's map is ``2·d·(2·H_kv·h) + 2·H_kv·h``
            FLOPs and replaces the map and the K/V projections.
        context: ``1`` for context maps (:func:`ridgefill.fill.context_features`): each map reads
            ``2·d`` features, so it costs ``2·(2d)·k + k`` FLOPs per filled row and stores ``2d·k + k``
            values per late layer (``k = d``, or ``2·H_kv·h`` with ``kv_maps``); ``0``: ``d`` features.

    Hybrid models (``shape.linear_layers``): module docstring.

    Raises:
        InputError: a size out of range, or a selected row outside the filled rows, or row selection or K/V maps
            for a hybrid model.
    """
    _check_sizes(shape, n, split, tail, bytes_per_value)
    if shape.linear_layers and (selected or kv_maps):
        raise InputError("row selection and K/V maps are not defined for models with linear-attention layers (their "
                         "exact rows are the tail; a recurrent layer has no K/V)")
    lower, late, filled = split + 1, shape.layers - split - 1, n - tail
    selected = sorted(int(p) for p in selected)
    if selected and (selected[0] < 0 or selected[-1] >= filled or len(set(selected)) != len(selected)):
        raise InputError(f"selected rows must be distinct positions among the filled rows 0..{filled - 1}")
    if not isinstance(rounds, int) or rounds < 0:
        raise InputError(f"rounds={rounds!r} must be an int ≥ 0")
    context = check_context(context)
    row = shape.projection_flops + shape.mlp_flops
    k = len(selected)
    # exact late-layer rows over all passes: the tail once, then the tail and the chosen rows per round
    passes = rounds if k else 0
    exact_rows = tail + passes * (tail + k)
    kv_rows = filled  # filled rows whose K/V come from the maps
    chosen_passes, leverage = passes, 0  # passes in which the chosen rows attend
    scoring_rows = 0  # rows whose predicted queries score (one-pass parts)
    if rounds == 0 and predicted:  # one pass: every row's map and K/V, then the tail and the chosen rows exact
        exact_rows, kv_rows, chosen_passes = tail + k, n, 1
        scoring_rows = min(queries, tail)
    elif rounds == 0 and k:  # chosen up front: one pass, the chosen rows exact, no filled K/V for them
        exact_rows, kv_rows, chosen_passes = tail + k, filled - k, 1
        leverage = 2 * shape.hidden ** 3 // 3 + n * (2 * shape.hidden ** 2 + 2 * shape.hidden)
    kv_out = 2 * shape.kv_heads * shape.head_dim
    features = shape.hidden * (1 + context)  # the maps' input width
    map_out = kv_out if kv_maps else shape.hidden
    map_flops = 2 * features * map_out + map_out if (maps or kv_maps) else 0
    kv_flops = 0 if kv_maps else shape.kv_flops
    chosen_attention = sum(shape.attention_flops(p, p + 1) for p in selected)
    scoring = (passes * min(queries, tail + k) + scoring_rows) * shape.attention_flops(n - 1, n)
    q_proj = 2 * shape.hidden * shape.heads * shape.head_dim
    lower_lin, late_lin = shape.linear_count(0, lower), shape.linear_count(lower, shape.layers)
    lower_att, late_att = lower - lower_lin, late - late_lin  # attention layers below and above the split
    parts = {
        "projections": (lower_att * n * shape.projection_flops
                        + late_att * (kv_rows * kv_flops + exact_rows * shape.projection_flops)
                        # linear-attention layers: every row's input projections; the output projection for rows
                        # that run the layer in full (all below the split, the tail above it)
                        + (lower_lin * n + late_lin * n) * shape.linear_in_flops
                        + (lower_lin * n + late_lin * exact_rows) * shape.linear_out_flops),
        "mlp": (lower * n + late * exact_rows) * shape.mlp_flops,
        "attention": (lower_att * shape.attention_flops(0, n)
                      + late_att * ((1 + passes) * shape.attention_flops(filled, n)
                                    + chosen_passes * chosen_attention + scoring)
                      + (lower_lin + late_lin) * n * shape.recurrence_flops),
        "maps": late * (kv_rows * map_flops + scoring_rows * (map_flops + q_proj)) + leverage,
        "lm_head": 2 * shape.hidden * shape.vocab,
    }
    if not shape.linear_layers:
        assert parts["projections"] + parts["mlp"] == (lower * n + late * exact_rows) * row + late * kv_rows * kv_flops
    extra = late * (features * map_out + map_out) if (maps or kv_maps) else 0
    return _finish(shape, n, parts, extra, bytes_per_value)


def ideal_ratio(config_or_shape, n: int, split: int, tail: int, *, maps: bool = True, selected=(),
                rounds: int = 1, kv_maps: bool = False, queries: int = 1, context: int = 0,
                predicted: bool = False) -> float:
    """``exact_cost(N).flops / fill_cost(N, S, T, ...).flops``: the speed-up of an ideal fill path when
    prefill is compute-bound. Accepts a ``transformers`` config or a :class:`ModelShape`; ``selected``,
    ``rounds``, ``kv_maps``, ``queries``, ``context`` and ``predicted`` as in :func:`fill_cost`.

    Raises:
        InputError: a size out of range or a config without the needed fields.
    """
    shape = config_or_shape if isinstance(config_or_shape, ModelShape) else ModelShape.from_config(config_or_shape)
    cost = fill_cost(shape, n, split, tail, maps=maps, selected=selected, rounds=rounds, kv_maps=kv_maps,
                     queries=queries, context=context, predicted=predicted)
    return exact_cost(shape, n).flops / cost.flops
