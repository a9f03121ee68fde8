"""Adapters for Llama-like families: Qwen2, Qwen3, Qwen3-MoE, Mistral, Phi-3.

Each layer is the Llama layer (pre-norm RMSNorm, grouped-query attention with RoPE, ``x + o_proj(attn)``
then ``x + mlp(post_attention_layernorm(x))``, :class:`~ridgefill.adapters.LlamaAdapter`); what differs,
per ``transformers``' ``modeling_<family>.py`` (the tests check each against it):

==============  =====================================================  ==================================
model_type      difference from Llama                                  how the adapter handles it
==============  =====================================================  ==================================
``qwen2``       biases on the Q/K/V projections; sliding window in     the model's own ``nn.Linear``
                layers ``>= max_window_layers`` when                   modules (biases included); fill_kv
                ``use_sliding_window``                                 folds the K/V bias; windows
``qwen3``,      per-head ``q_norm``/``k_norm`` RMSNorm before RoPE;    :class:`~.parts.QKNorm` (shared with
``qwen3_moe``   optional ``attention_bias``, sliding window;           Gemma 3), per-layer K/V path (no
                Qwen3-MoE: mixture-of-experts MLP                      fill_kv); the MoE MLP module as is
``mistral``     sliding window in every layer when                     :class:`~.parts.SlidingWindows`
                ``config.sliding_window`` is set
``phi3``        fused ``qkv_proj`` and ``gate_up_proj``; optional      :meth:`Phi3Adapter.kv_weights`
                sliding window in every layer; optional partial        (rows of ``qkv_proj``), the MLP
                rotary embedding (``partial_rotary_factor``)           module as is; partial RoPE in
                                                                       :func:`~.base.apply_rope`
==============  =====================================================  ==================================

The batched filled-row path :meth:`~ridgefill.adapters.LlamaAdapter.fill_kv` is used for Qwen2, Mistral
and Phi-3 (full rotary), where it equals :meth:`kv`; Qwen3 (k-norm) and partial-rotary Phi-3 use the
per-layer path. In sliding-window layers only the filled rows some exact row sees get K/V
(:meth:`~.parts.SlidingWindows.needed_filled_rows`), which also routes the fill to the per-layer path.

Shapes as in :mod:`ridgefill.adapters.base`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .llama import LlamaAdapter
from .parts import QKNorm, SlidingWindows, layer_types_of


class _Windowed(SlidingWindows, LlamaAdapter):
    """A Llama layer with the sliding windows ``transformers`` derives from the config
    (:func:`~.parts.layer_types_of`); with no window every layer is plain causal."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.init_windows(layer_types_of(self.config), getattr(self.config, "sliding_window", None))


class Qwen2Adapter(_Windowed):
    """``Qwen2ForCausalLM``: Llama layer with Q/K/V biases (see module docstring)."""

    model_types = ("qwen2",)


class MistralAdapter(_Windowed):
    """``MistralForCausalLM``: Llama layer, sliding window in every layer when set (see module docstring)."""

    model_types = ("mistral",)


class Qwen3Adapter(QKNorm, _Windowed):
    """``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``: per-head q/k RMSNorm before RoPE (see module
    docstring)."""

    model_types = ("qwen3", "qwen3_moe")


class Phi3Adapter(_Windowed):
    """``Phi3ForCausalLM``: fused QKV projection ``qkv_proj`` (rows: Q, then K, then V) and fused
    gate/up MLP (the model's MLP module is used as is); see module docstring."""

    model_types = ("phi3",)

    def _qkv_sizes(self) -> tuple[int, int]:
        return self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim

    def project_qkv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V ``[batch, heads, rows, head_dim]`` (before RoPE) from the normed input ``h``: one
        ``qkv_proj`` matmul, split into Q, K, V."""
        qd, kvd = self._qkv_sizes()
        q, k, v = self.body.layers[layer].self_attn.qkv_proj(h).split([qd, kvd, kvd], dim=-1)
        return (self._split_heads(q, self.num_heads), self._split_heads(k, self.num_kv_heads),
                self._split_heads(v, self.num_kv_heads))

    def kv_weights(self, layer: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """``W_k``, ``W_v`` ``[kv_heads·head_dim, hidden]``: the K and V rows of ``qkv_proj.weight``
        (views), and the matching rows of its bias (``None`` without bias)."""
        qd, kvd = self._qkv_sizes()
        proj = self.body.layers[layer].self_attn.qkv_proj
        w, b = proj.weight, proj.bias
        return (w[qd:qd + kvd], w[qd + kvd:], None if b is None else b[qd:qd + kvd],
                None if b is None else b[qd + kvd:])
