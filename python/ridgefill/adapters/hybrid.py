"""Hybrid models with recurrent-state layers: Qwen3-Next (``qwen3_next``) and the Qwen3.5 text model
(``qwen3_5_text``).

Their layers (``config.layer_types``) are of two kinds (``transformers``' ``modeling_qwen3_next.py``,
``modeling_qwen3_5.py``):

- ``"full_attention"``: the Llama layer with (1 + weight) RMSNorms, per-head ``q_norm``/``k_norm``
  before RoPE (:class:`~.parts.QKNorm`), partial RoPE (``partial_rotary_factor``), and an output gate:
  ``q_proj`` gives per head ``[q, gate]`` and the attention output is multiplied by ``sigmoid(gate)``
  before ``o_proj``. These layers work as in every other model: K/V buffers, filled rows write K/V.
- ``"linear_attention"`` (Gated DeltaNet): the layer keeps a *recurrent state* instead of K/V: a
  convolution state (the last ``linear_conv_kernel_dim`` inputs of a causal depthwise convolution over
  the mixed Q/K/V projections) and a delta-rule state ``[batch, value_heads, key_dim, value_dim]``
  updated by ``S ← g·S + β k (v − Sᵀk)ᵀ`` row by row (gates ``g`` from ``A_log``, ``dt_bias`` and the
  ``a`` projection, ``β = sigmoid(b)``). Each row's output reads the state after that row.

The fill in a late linear-attention layer (:meth:`HybridAdapter.advance_state`): the filled rows,
which come first, advance the layer's conv and delta-rule state from their predicted inputs ``x̂_l``
through the layer's own input norm, projections, convolution, gates and delta-rule kernel (the
library's reference torch kernels); their outputs are not used (the chunked kernel computes the
core outputs as a by-product; the gated norm, ``out_proj``, residual and MLP are not run for them).
The exact rows then run the model's own decoder layer, continuing from that state
(:meth:`HybridAdapter.layer`), exactly as ``transformers`` continues a prefill in chunks. Because a
recurrent state is a running summary, exact rows must be a suffix of the prompt (the tail): other
``exact_rows`` are refused (:meth:`HybridAdapter.check_exact_rows`).

Splice tests of the state (:func:`ridgefill.evaluate.splice.splice_variants`, component ``"state"``):
inside :meth:`HybridAdapter.spliced_states`, :meth:`HybridAdapter.advance_state` loads given exact
states (from an exact forward of the filled rows) instead of advancing from the predicted inputs, so
the exact rows start from the true state while the fill is otherwise unchanged.

Per-layer states live in one ``transformers`` ``DynamicCache`` for the whole prefill
(:meth:`HybridAdapter.new_state`); :meth:`HybridAdapter.build_cache` adds the attention layers' K/V to
it, so ``generate`` continues from the conv and recurrent states the model's own decoding expects.

Not handled: the multimodal ``Qwen3_5ForConditionalGeneration`` (``model_type`` ``"qwen3_5"``; load
the text model ``Qwen3_5ForCausalLM``), attention-mask padding.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError, UnsupportedModelError
from .base import Rope, apply_rope, host_positions, write_rows
from .llama import LlamaAdapter
from .parts import FULL, QKNorm

LINEAR = "linear_attention"


class HybridAdapter(QKNorm, LlamaAdapter):
    """Per-layer access to a Qwen3-Next / Qwen3.5 text model (see module docstring).

    Shapes as in :mod:`ridgefill.adapters.base`; recurrent layers take the state cache of
    :meth:`new_state` in place of the K/V buffers.
    """

    model_types = ("qwen3_next", "qwen3_5_text")

    def __init__(self, model: torch.nn.Module):
        cfg = model.config
        types = list(getattr(cfg, "layer_types", None) or [])
        if len(types) != cfg.num_hidden_layers or set(types) - {LINEAR, FULL}:
            raise UnsupportedModelError(
                f"config.layer_types must list {LINEAR!r} or {FULL!r} for each of the {cfg.num_hidden_layers} "
                f"layers; got {types}")
        if FULL not in types:
            raise UnsupportedModelError("this hybrid model has no full-attention layer; RidgeFill needs at least one")
        super().__init__(model)
        self.layer_types: list[str] = types
        self.recurrent_layers: tuple[int, ...] = tuple(i for i, t in enumerate(types) if t == LINEAR)
        self._spliced: dict[int, tuple[Tensor, Tensor]] = {}  # see spliced_states

    # --- recurrent-state layers -------------------------------------------------------------
    def new_state(self):
        """An empty ``transformers`` ``DynamicCache`` that holds the conv and delta-rule states of every
        recurrent layer during one prefill (pass it as ``keys`` to :meth:`layer` for those layers)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def check_exact_rows(self, num_rows: int, exact_positions: np.ndarray) -> None:
        """Exact rows must be the last ``len(exact_positions)`` rows (a tail): a recurrent state is a
        running summary, so a filled row after an exact row would have to advance a state the exact row
        already read.

        Raises:
            InputError: ``exact_positions`` is not ``num_rows - E .. num_rows - 1``.
        """
        exact_positions = np.asarray(exact_positions)
        if not np.array_equal(exact_positions, np.arange(num_rows - exact_positions.size, num_rows)):
            raise InputError(
                f"this model has recurrent-state (linear-attention) layers {list(self.recurrent_layers)}: its exact "
                "rows must be a suffix of the prompt (the tail). Drop exact_rows and use a longer tail instead")

    def _kernels(self, module):
        mod = sys.modules[type(module).__module__]
        return mod.causal_conv1d_fn, mod.torch_chunk_gated_delta_rule

    def _mixed_qkv_and_gates(self, la, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The convolution input ``[batch, rows, conv_dim]`` (mixed Q/K/V projections) and the ``b``,
        ``a`` gate projections ``[batch, rows, value_heads]`` of a Gated DeltaNet module ``la``."""
        if hasattr(la, "in_proj_qkvz"):  # Qwen3-Next: fused, grouped per key head
            q, k, v, _z, b, a = la.fix_query_key_value_ordering(la.in_proj_qkvz(h), la.in_proj_ba(h))
            mixed = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v)], dim=-1)
            return mixed, b, a
        return la.in_proj_qkv(h), la.in_proj_b(h), la.in_proj_a(h)  # Qwen3.5: separate projections

    @torch.no_grad()
    def advance_state(self, layer: int, x: Tensor, state) -> None:
        """Advance recurrent ``layer``'s conv and delta-rule states in ``state`` (a :meth:`new_state`
        cache, not yet advanced in this layer) over rows whose layer input is ``x`` ``[batch, rows,
        hidden]``, the first rows of the prompt, through the layer's input norm, projections,
        convolution, gates and chunked delta-rule kernel, as the layer's own forward does; no output
        is computed beyond the kernel's by-product. Inside :meth:`spliced_states` a layer it names gets
        the given states instead (``x`` is then only checked for its batch size).

        Raises:
            ValueError: ``layer`` is not a recurrent layer, or its state was already advanced, or a
                spliced state's batch differs from ``x``'s.
        """
        if not self.is_recurrent(layer):
            raise ValueError(f"layer {layer} is not a recurrent-state layer")
        entry = state.layers[layer]
        if any(entry.has_previous_state.values()):
            raise ValueError(f"the state of layer {layer} was already advanced; filled rows come first")
        block = self.body.layers[layer]
        la = block.linear_attn
        if layer in self._spliced:
            conv, rec = self._spliced[layer]
            if conv.shape[0] != x.shape[0] or rec.shape[0] != x.shape[0]:
                raise ValueError(f"spliced states of layer {layer} have batch {conv.shape[0]}, the rows {x.shape[0]}")
            state.update_conv_state(conv.to(x.device, x.dtype), layer, conv_kernel_size=la.conv_kernel_size)
            state.update_recurrent_state(rec.to(x.device), layer)
            return
        conv_fn, rule = self._kernels(la)
        rows = x.shape[1]
        mixed, b, a = self._mixed_qkv_and_gates(la, block.input_layernorm(x))
        mixed = state.update_conv_state(mixed.transpose(1, 2), layer, conv_kernel_size=la.conv_kernel_size)
        mixed = conv_fn(mixed, la.conv1d.weight.squeeze(1), la.conv1d.bias, activation=la.activation)
        mixed = mixed[:, :, -rows:].transpose(1, 2)
        q, k, v = torch.split(mixed, [la.key_dim, la.key_dim, la.value_dim], dim=-1)
        q = q.reshape(q.shape[0], rows, -1, la.head_k_dim)
        k = k.reshape(k.shape[0], rows, -1, la.head_k_dim)
        v = v.reshape(v.shape[0], rows, -1, la.head_v_dim)
        beta = b.sigmoid()
        g = -la.A_log.float().exp() * F.softplus(a.float() + la.dt_bias)
        _, final = rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        state.update_recurrent_state(final, layer)

    @contextlib.contextmanager
    def spliced_states(self, states: Mapping[int, tuple[Tensor, Tensor]]) -> Iterator[None]:
        """The splice test of the recurrent state: while open, :meth:`advance_state` of each layer ``l``
        in ``states`` sets that layer's state to ``states[l] = (conv [batch, conv_dim, kernel],
        delta-rule [batch, value_heads, key_dim, value_dim])`` (e.g. the exact states after the filled
        rows, :func:`ridgefill.evaluate.splice.exact_states`) instead of advancing it from the
        predicted inputs. Attention layers and the exact rows are untouched.

        Raises:
            ValueError: a layer that is not recurrent, a conv state without ``linear_conv_kernel_dim``
                columns, or a splice already open on this adapter.
        """
        if self._spliced:
            raise ValueError("a state splice is already open on this model")
        for layer, (conv, _rec) in states.items():
            if not self.is_recurrent(layer):
                raise ValueError(f"layer {layer} is not a recurrent-state layer; recurrent: {list(self.recurrent_layers)}")
            kernel = self.body.layers[layer].linear_attn.conv_kernel_size
            if conv.ndim != 3 or conv.shape[-1] != kernel:
                raise ValueError(f"the conv state of layer {layer} must be [batch, conv_dim, {kernel}]; got "
                                 f"{tuple(conv.shape)}")
        self._spliced = dict(states)
        try:
            yield
        finally:
            self._spliced = {}

    # --- attention layers -----------------------------------------------------------------------
    def kv(self, layer: int, x: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        """Keys (after ``k_norm`` and RoPE) and values of attention ``layer`` for rows with layer input
        ``x``, as :meth:`LlamaAdapter.kv`.

        Raises:
            UnsupportedModelError: ``layer`` is a recurrent-state layer (it has no K/V; see
                :meth:`advance_state`).
        """
        if self.is_recurrent(layer):
            raise UnsupportedModelError(f"layer {layer} is a recurrent-state (linear-attention) layer: it has no "
                                        "keys/values; K/V splice tests do not apply to it")
        return super().kv(layer, x, rope)

    def project_qkv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q (after ``q_norm``), K (after ``k_norm``), V ``[batch, heads, rows, head_dim]``, before
        RoPE; the output gate is :meth:`output_gate`."""
        attn = self.body.layers[layer].self_attn
        b, r, _ = h.shape
        q, _gate = attn.q_proj(h).view(b, r, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k, v = self.project_kv(layer, h)
        return attn.q_norm(q).transpose(1, 2), k, v

    def output_gate(self, layer: int, h: Tensor) -> Tensor:
        """The output gate ``[batch, rows, heads·head_dim]`` (before the sigmoid) of attention ``layer``."""
        b, r, _ = h.shape
        q = self.body.layers[layer].self_attn.q_proj(h).view(b, r, self.num_heads, 2 * self.head_dim)
        return q[..., self.head_dim:].reshape(b, r, -1)

    def layer(self, layer: int, x: Tensor, rope: Rope, positions: Tensor, keys, values: Tensor | None,
              visible: Tensor | None = None, *, host: np.ndarray | None = None) -> Tensor:
        """Full forward of ``layer`` for rows ``x`` ``[batch, rows, hidden]`` at ``positions``.

        Attention layers: as :meth:`LlamaAdapter.layer` (K/V written into ``keys``/``values``), with
        q/k norms and the output gate. Recurrent layers: ``keys`` is the :meth:`new_state` cache; the
        model's own decoder layer runs on the rows, continuing from (and updating) the layer's state,
        so the rows must follow every row already in the state (``visible`` does not apply: rows not
        in the state are simply not seen)."""
        block = self.body.layers[layer]
        if self.is_recurrent(layer):
            if not hasattr(keys, "layers"):  # K/V buffers given (e.g. calibration): every row from an empty state
                host = host_positions(positions, host)
                if host.size != x.shape[1] or not np.array_equal(host, np.arange(host.size)):
                    raise ValueError(f"recurrent layer {layer} without a state cache needs the rows 0..N-1 in order")
                keys = None
            out = block(x, position_embeddings=None, attention_mask=None, cache=keys)
            return out[0] if isinstance(out, tuple) else out
        h = block.input_layernorm(x)
        q, k, v = self.project_qkv(layer, h)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        write_rows(keys, values, positions, k, v)
        out = self.attend(layer, q, positions, keys, values, visible, host=host)
        b, _, r, _ = out.shape
        out = out.transpose(1, 2).reshape(b, r, -1) * torch.sigmoid(self.output_gate(layer, h))
        x = x + block.self_attn.o_proj(out)
        mlp = block.mlp(block.post_attention_layernorm(x))
        return x + (mlp[0] if isinstance(mlp, tuple) else mlp)

    def build_cache(self, keys: list, values: list):
        """The ``transformers`` cache for decoding: the :meth:`new_state` cache found in ``keys`` at the
        recurrent layers (their conv and delta-rule states), with ``keys[l]``/``values[l]`` ``[batch,
        kv_heads, rows, head_dim]`` added for every attention layer ``l``."""
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise ValueError(f"build_cache needs an entry for all {self.num_layers} layers; got {len(keys)}")
        cache = keys[self.recurrent_layers[0]]
        for layer, (k, v) in enumerate(zip(keys, values)):
            if not self.is_recurrent(layer):
                cache.update(k, v, layer)
        return cache
