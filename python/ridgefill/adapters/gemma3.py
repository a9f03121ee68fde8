"""The Gemma 3 adapter (``Gemma3ForCausalLM``, text only, ``model_type`` ``"gemma3_text"``).

What differs from Llama (``transformers``' ``modeling_gemma3.py``; the tests check the layer forward
below against it):

- the token embedding is scaled by ``sqrt(hidden)`` (the model's ``embed_tokens`` module does it);
- RMSNorm multiplies by ``1 + weight`` (the model's own norm modules are used throughout);
- per-head RMSNorm of queries and keys (``q_norm``, ``k_norm``) before RoPE, so the cache holds
  ``rope(k_norm(k_proj(input_layernorm(x))))``;
- a sandwich layer: ``x + post_attention_layernorm(attn(input_layernorm(x)))``, then
  ``x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))``;
- attention scores scaled by ``query_pre_attn_scalar ** -0.5`` (not ``head_dim ** -0.5``);
- two kinds of layers (``config.layer_types``): ``"sliding_attention"`` layers use RoPE with the local
  base (``rope_parameters["sliding_attention"]``, 10 000) and let the row at position ``p`` see only
  keys at positions in ``(p - sliding_window, p]``; ``"full_attention"`` layers use the global base
  (1 000 000) and plain causal attention. Gemma 3 270M has 18 layers, five sliding (window 512) to
  one full. :meth:`Gemma3Adapter.rope` therefore returns a :class:`~ridgefill.adapters.base.RopeByType`.

Sliding-window layers attend block by block (query rows in blocks of ``sliding_window`` rows, each
against the keys its window can reach), so a prefill of ``N`` rows costs ``O(N * window)`` there,
not ``O(N^2)``, and never builds an ``[N, N]`` mask.

In a sliding layer a filled row is read only if some exact row at or after it lies within its window
(:meth:`Gemma3Adapter.needed_filled_rows`): with a tail of ``T`` rows and no other exact rows, only
the last ``window - 1`` filled rows need K/V there, however long the prompt.

Not supported (raises :class:`~ridgefill.errors.UnsupportedModelError`): attention-logit soft-capping
(``attn_logit_softcapping``; ``None`` in Gemma 3) and bidirectional attention. The multimodal
``Gemma3ForConditionalGeneration`` (``model_type`` ``"gemma3"``) is not handled: load the text model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..errors import UnsupportedModelError
from .base import Rope, RopeByType, apply_rope, host_positions, write_rows
from .llama import LlamaAdapter
from .parts import FULL, SLIDING, QKNorm, SlidingWindows  # noqa: F401  (FULL, SLIDING: re-exported)


class Gemma3Adapter(QKNorm, SlidingWindows, LlamaAdapter):
    """Per-layer access to a ``Gemma3ForCausalLM`` (see module docstring).

    Shapes as in :mod:`ridgefill.adapters.base`: hidden states ``[batch, rows, hidden]``, K/V
    ``[batch, kv_heads, positions, head_dim]`` indexed by absolute position, positions ``int64`` ``[rows]``.
    """

    model_types = ("gemma3_text",)

    def __init__(self, model: torch.nn.Module):
        cfg = model.config
        if getattr(cfg, "attn_logit_softcapping", None) is not None:
            raise UnsupportedModelError(
                f"this Gemma 3 config sets attn_logit_softcapping={cfg.attn_logit_softcapping}; the RidgeFill "
                "Gemma 3 adapter supports only attn_logit_softcapping=None (as in the released Gemma 3 models)")
        if getattr(cfg, "use_bidirectional_attention", False):
            raise UnsupportedModelError("this Gemma 3 config sets use_bidirectional_attention=True; RidgeFill "
                                        "needs causal attention")
        super().__init__(model)
        self.init_windows(getattr(cfg, "layer_types", None), getattr(cfg, "sliding_window", None))
        self.final_logit_softcapping: float | None = getattr(cfg, "final_logit_softcapping", None)

    # --- hooks ---------------------------------------------------------------------------
    def rope(self, positions: Tensor, like: Tensor) -> RopeByType:
        """RoPE tables ``[1, rows, head_dim]`` for ``positions`` ``[rows]``, one per layer type (local
        base for sliding layers, global base for full layers), in the dtype/device of ``like``."""
        tables = {}
        for layer_type in sorted(set(self.layer_types)):
            cos, sin = self.body.rotary_emb(like, positions[None], layer_type)
            tables[layer_type] = Rope(cos, sin)
        return RopeByType(tables)

    def layer_rope(self, layer: int, rope: RopeByType) -> Rope:
        """The tables of ``layer``'s type (local base in sliding layers, global in full layers)."""
        return self._rope_of(layer, rope)

    def _rope_of(self, layer: int, rope: RopeByType) -> Rope:
        if not isinstance(rope, RopeByType):
            raise TypeError(f"Gemma3Adapter needs the RoPE tables of its own rope() (a RopeByType, one table "
                            f"per layer type); got {type(rope).__name__}")
        return rope[self.layer_types[layer]]

    def kv(self, layer: int, x: Tensor, rope: RopeByType) -> tuple[Tensor, Tensor]:
        """Cache entries of ``layer`` for rows with layer input ``x`` ``[batch, rows, hidden]``: keys
        ``rope(k_norm(k_proj(input_layernorm(x))))`` and values ``v_proj(input_layernorm(x))``, each
        ``[batch, kv_heads, rows, head_dim]``; ``rope`` holds the tables of those rows."""
        h = self.body.layers[layer].input_layernorm(x)
        k, v = self.project_kv(layer, h)
        return apply_rope(k, self._rope_of(layer, rope)), v

    def layer(self, layer: int, x: Tensor, rope: RopeByType, positions: Tensor, keys: Tensor,
              values: Tensor, visible: Tensor | None = None, *, host: np.ndarray | None = None) -> Tensor:
        """Full forward of Gemma 3 ``layer`` for rows ``x`` ``[batch, rows, hidden]`` at sorted
        ``positions`` ``[rows]``: writes their K/V into ``keys``/``values`` ``[batch, kv_heads, P,
        head_dim]`` at their positions, attends causally (within the window in sliding layers, and only
        to ``visible`` ``[P]`` positions when given) and returns the layer output, shaped like ``x``."""
        host = host_positions(positions, host)
        if host.size > 1 and bool((host[1:] <= host[:-1]).any()):
            raise ValueError("Gemma3Adapter.layer needs strictly increasing positions")
        block = self.body.layers[layer]
        q, k, v = self.project_qkv(layer, block.input_layernorm(x))
        r = self._rope_of(layer, rope)
        q, k = apply_rope(q, r), apply_rope(k, r)
        write_rows(keys, values, positions, k, v)
        out = self.attend(layer, q, positions, keys, values, visible, host=host)
        b, _, rows, _ = out.shape
        attn = block.self_attn.o_proj(out.transpose(1, 2).reshape(b, rows, -1))
        x = x + block.post_attention_layernorm(attn)
        return x + block.post_feedforward_layernorm(block.mlp(block.pre_feedforward_layernorm(x)))

    def logits(self, x: Tensor) -> Tensor:
        """Final norm and LM head (with ``final_logit_softcapping`` when the config sets it) on
        ``[batch, rows, hidden]`` -> ``[batch, rows, vocab]``."""
        out = self.model.lm_head(self.body.norm(x))
        if self.final_logit_softcapping is not None:
            out = torch.tanh(out / self.final_logit_softcapping) * self.final_logit_softcapping
        return out
