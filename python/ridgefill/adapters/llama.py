"""The Llama adapter (``LlamaForCausalLM``; also used for architectures with the same layer).

Each layer is pre-norm: ``x + o_proj(attn(rope(q), rope(k), v))`` then ``x + mlp(norm(x))``, with
RMSNorm, grouped-query attention and RoPE, as in ``transformers``' ``modeling_llama.py``. The
layer forward below reproduces it with the model's own modules; the tests check it against the
``transformers`` forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import DecoderAdapter, Rope, apply_rope


class LlamaAdapter(DecoderAdapter):
    model_types = ("llama",)

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.body = model.model
        first = self.body.layers[0].self_attn
        self.head_dim: int = first.head_dim
        self.num_heads: int = self.config.num_attention_heads
        self.num_kv_heads: int = self.config.num_key_value_heads
        self.scaling: float = first.scaling
        # K and V projections fused into one matmul for the filled rows of each layer, keyed by
        # the source weights' identity and version so that edits or moves of the model are seen.
        self._kv_weight: dict[int, tuple[tuple, Tensor, Tensor | None]] = {}

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.body.embed_tokens(input_ids)

    def rope(self, positions: Tensor, like: Tensor) -> Rope:
        cos, sin = self.body.rotary_emb(like, position_ids=positions[None])
        return Rope(cos, sin)

    def _split_heads(self, t: Tensor, heads: int) -> Tensor:
        b, r, _ = t.shape
        return t.view(b, r, heads, self.head_dim).transpose(1, 2)

    def project_qkv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V ``[batch, heads, rows, head_dim]`` (before RoPE) from the normed input ``h``."""
        attn = self.body.layers[layer].self_attn
        return (self._split_heads(attn.q_proj(h), self.num_heads),
                self._split_heads(attn.k_proj(h), self.num_kv_heads),
                self._split_heads(attn.v_proj(h), self.num_kv_heads))

    def project_kv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor]:
        """K, V (before RoPE) from the normed input ``h``, with one fused matmul."""
        attn = self.body.layers[layer].self_attn
        wk, wv = attn.k_proj.weight, attn.v_proj.weight
        key = (wk.data_ptr(), wv.data_ptr(), wk._version, wv._version, wk.dtype)
        if self._kv_weight.get(layer, (None,))[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # usable inside and outside inference mode
                w = torch.cat([wk, wv])
                b = None if attn.k_proj.bias is None else torch.cat([attn.k_proj.bias, attn.v_proj.bias])
            self._kv_weight[layer] = (key, w, b)
        _, w, b = self._kv_weight[layer]
        k, v = F.linear(h, w, b).split(self.num_kv_heads * self.head_dim, dim=-1)
        return self._split_heads(k, self.num_kv_heads), self._split_heads(v, self.num_kv_heads)

    def kv(self, layer: int, x: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        h = self.body.layers[layer].input_layernorm(x)
        k, v = self.project_kv(layer, h)
        return apply_rope(k, rope), v

    def visible_keys(self, layer: int, positions: Tensor, num_keys: int,
                     visible: Tensor | None) -> Tensor | None:
        """Boolean attention mask ``[rows, num_keys]``: key ``j`` is visible to the row at position
        ``p`` iff ``j <= p`` (and ``visible[j]``). ``None`` means plain causal over all rows."""
        if visible is None and positions.numel() == num_keys:
            return None  # all rows, in order: SDPA's causal kernel
        keys = torch.arange(num_keys, device=positions.device)
        mask = keys[None, :] <= positions[:, None]
        if visible is not None:
            mask &= visible[None, :]
        return mask

    def layer(self, layer: int, x: Tensor, rope: Rope, positions: Tensor, keys: Tensor,
              values: Tensor, visible: Tensor | None = None) -> Tensor:
        block = self.body.layers[layer]
        q, k, v = self.project_qkv(layer, block.input_layernorm(x))
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if positions.numel() == keys.shape[2]:
            keys.copy_(k)
            values.copy_(v)
        else:
            keys[:, :, positions] = k
            values[:, :, positions] = v
        mask = self.visible_keys(layer, positions, keys.shape[2], visible)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=mask is None, scale=self.scaling,
            enable_gqa=self.num_heads != self.num_kv_heads)
        b, _, r, _ = out.shape
        x = x + block.self_attn.o_proj(out.transpose(1, 2).reshape(b, r, -1))
        return x + block.mlp(block.post_attention_layernorm(x))

    def logits(self, x: Tensor) -> Tensor:
        return self.model.lm_head(self.body.norm(x))
