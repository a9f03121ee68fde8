"""The Llama adapter (``LlamaForCausalLM``; also used for architectures with the same layer).

Each layer is pre-norm: ``x + o_proj(attn(rope(q), rope(k), v))`` then ``x + mlp(norm(x))``, with
RMSNorm, grouped-query attention and RoPE, as in ``transformers``' ``modeling_llama.py``. The
layer forward below reproduces it with the model's own modules; the tests check it against the
``transformers`` forward.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import DecoderAdapter, Rope, apply_rope, host_positions, write_rows


def plain_rms_norms() -> tuple[type, ...]:
    """The ``transformers`` RMSNorm classes that compute exactly ``weight * x / sqrt(mean(x²) + eps)``
    (in float32, cast back before the weight) with ``variance_epsilon``, as :meth:`LlamaAdapter.fill_kv`
    assumes (copies of ``LlamaRMSNorm``)."""
    import importlib

    found = []
    for module, name in (("llama", "LlamaRMSNorm"), ("qwen2", "Qwen2RMSNorm"), ("qwen3", "Qwen3RMSNorm"),
                         ("qwen3_moe", "Qwen3MoeRMSNorm"), ("mistral", "MistralRMSNorm"), ("phi3", "Phi3RMSNorm")):
        try:
            found.append(getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


class LlamaAdapter(DecoderAdapter):
    model_types = ("llama",)
    #: Exact rows per attention call when they are not every row in order (a tail, row selection):
    #: each block reads the keys up to its latest row only (:meth:`attend`).
    query_block: int = 128

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.body = model.model
        first = next(b.self_attn for b in self.body.layers if hasattr(b, "self_attn"))  # hybrids: not layer 0
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

    def kv_weights(self, layer: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """The K and V projections of ``layer``: ``W_k``, ``W_v`` ``[kv_heads·head_dim, hidden]`` and
        their biases ``[kv_heads·head_dim]`` (``None`` without bias), views of the model's weights.
        Models with a fused QKV projection (Phi-3) override this."""
        attn = self.body.layers[layer].self_attn
        return attn.k_proj.weight, attn.v_proj.weight, attn.k_proj.bias, attn.v_proj.bias

    def project_kv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor]:
        """K, V (before RoPE) from the normed input ``h``, with one fused matmul."""
        wk, wv, bk, bv = self.kv_weights(layer)
        key = (wk.data_ptr(), wv.data_ptr(), wk._version, wv._version, wk.dtype)
        if self._kv_weight.get(layer, (None,))[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # usable inside and outside inference mode
                w = torch.cat([wk, wv])
                b = None if bk is None else torch.cat([bk, bv])
            self._kv_weight[layer] = (key, w, b)
        _, w, b = self._kv_weight[layer]
        k, v = F.linear(h, w, b).split(self.num_kv_heads * self.head_dim, dim=-1)
        return self._split_heads(k, self.num_kv_heads), self._split_heads(v, self.num_kv_heads)

    def layer_rope(self, layer: int, rope: Rope) -> Rope:
        """The RoPE tables ``layer`` uses, out of what :meth:`rope` returned (one table here)."""
        return rope

    def queries(self, layer: int, x: Tensor, rope: Rope) -> Tensor:
        """Queries after RoPE ``[batch, heads, rows, head_dim]`` of rows with layer input ``x``
        ``[batch, rows, hidden]`` (row selection scores filled rows by the attention of these)."""
        q = self.project_qkv(layer, self.body.layers[layer].input_layernorm(x))[0]
        return apply_rope(q, self.layer_rope(layer, rope))

    def kv_targets(self, layer: int, x: Tensor) -> Tensor:
        """The pre-RoPE keys and values of rows with layer input ``x`` ``[batch, rows, hidden]``, flat:
        ``[batch, rows, 2·kv_dim]`` (keys, then values; heads in order). The targets of K/V maps."""
        k, v = self.project_kv(layer, self.body.layers[layer].input_layernorm(x))
        return torch.cat([k.transpose(1, 2).flatten(2), v.transpose(1, 2).flatten(2)], dim=-1)

    def kv_from_targets(self, layer: int, t: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        """Cache entries from pre-RoPE K/V ``t`` ``[batch, rows, 2·kv_dim]`` (the layout of
        :meth:`kv_targets`): keys after RoPE and values, each ``[batch, kv_heads, rows, head_dim]``."""
        kvd = self.num_kv_heads * self.head_dim
        k, v = self._split_heads(t[..., :kvd], self.num_kv_heads), self._split_heads(t[..., kvd:], self.num_kv_heads)
        return apply_rope(k, self.layer_rope(layer, rope)), v

    def kv(self, layer: int, x: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        h = self.body.layers[layer].input_layernorm(x)
        k, v = self.project_kv(layer, h)
        return apply_rope(k, rope), v

    # --- the fast map-plus-K/V step for filled rows -----------------------------------------
    #: Upper bound, in bytes, of one block of predicted inputs ``x̂`` and their K/V held at once by
    #: :meth:`fill_kv` (``[rows, hidden + 2·kv_dim]``); longer prompts are processed in blocks of rows.
    fill_chunk_bytes: int = 16 * 2 ** 20

    def supports_fill_kv(self) -> bool:
        """Whether :meth:`fill_kv` computes exactly what :meth:`kv` computes for this model: a plain
        Llama-style layer (RMSNorm ``g ⊙ x / rms(x)``, K/V projections with optional biases, RoPE over
        the whole head). A subclass that changes the norm, the K/V projection or RoPE (Gemma 3, Qwen3
        with their q/k norms), or a model with partial rotary embeddings returns ``False`` and the fill
        uses the per-layer path."""
        cls = type(self)
        if (cls.kv is not LlamaAdapter.kv or cls.project_kv is not LlamaAdapter.project_kv
                or cls.rope is not LlamaAdapter.rope):
            return False
        like = self.body.layers[0].input_layernorm.weight.detach()[None, None]
        probe = self.rope(torch.zeros(1, dtype=torch.long, device=like.device), like)  # RoPE over the whole head?
        if probe.cos.shape[-1] != self.head_dim:
            return False
        norms = plain_rms_norms()
        return all(type(b.input_layernorm) in norms for b in self.body.layers)

    def _folded_kv(self, layers: range) -> tuple[Tensor, Tensor | None, float]:
        """``([layers, d, 2·kv_dim], [layers, 2·kv_dim] or None, eps)``: each layer's fused K/V weight
        (transposed) with its input-norm weight folded in, ``(g ⊙ [W_k; W_v])ᵀ``, and the K/V bias;
        cached while the source weights are unchanged."""
        blocks = [self.body.layers[i] for i in layers]
        proj = [self.kv_weights(i) for i in layers]  # (W_k, W_v, b_k, b_v) per layer
        srcs = [t for b, p in zip(blocks, proj) for t in (p[0], p[1], b.input_layernorm.weight)]
        key = (tuple(layers), tuple((t.data_ptr(), t._version) for t in srcs), srcs[0].dtype, srcs[0].device)
        cached = getattr(self, "_fill_kv_cache", None)
        if cached is None or cached[0] != key:
            eps = {float(b.input_layernorm.variance_epsilon) for b in blocks}
            with torch.inference_mode(False), torch.no_grad():
                w = torch.stack([(torch.cat([p[0], p[1]]) * b.input_layernorm.weight[None, :]).t()
                                 for b, p in zip(blocks, proj)]).contiguous()
                bias = None
                if proj[0][2] is not None:
                    bias = torch.stack([torch.cat([p[2], p[3]]) for p in proj])
            cached = (key, w, bias, eps)
            self._fill_kv_cache = cached
        _, w, bias, eps = cached
        if len(eps) != 1:
            raise ValueError(f"fill_kv needs one RMSNorm epsilon for all late layers; got {sorted(eps)}")
        return w, bias, next(iter(eps))

    @torch.no_grad()
    def fill_kv(self, layers: range, h: Tensor, weights: Tensor | None, biases: Tensor | None, rope: Rope,
                keys: list[Tensor], values: list[Tensor], start: int, stop: int) -> None:
        """Keys and values of the rows ``start .. stop-1`` for every late layer in ``layers``, from the split
        state, written into the cache buffers at those rows.

        For each layer ``l``: ``x̂_l = f W_l + b_l``, where ``f`` is the row's ``h_S`` or, for context maps
        (``weights`` ``[late, 2d, d]``), ``[h_S(t), h_S(t−1)]`` (``h_S(−1) = 0``,
        :func:`ridgefill.maps.context_features`), computed as two matmuls on ``h`` without building the
        features; ``h_S`` itself when ``weights`` is ``None`` (the identity fill). Then the layer's input
        RMSNorm, fused K/V projection and RoPE, as :meth:`kv` does, but computed as: the RMS of each
        ``x̂_l`` row (a norm reduction, no normalised copy), one matmul with the K/V weights into which the
        norm weight ``g`` is folded (``(x̂/rms) (g ⊙ W)ᵀ = (x̂ (g ⊙ W)ᵀ)/rms``), and RoPE written straight
        into ``keys``. One layer at a time, in blocks of rows of at most :attr:`fill_chunk_bytes`. Equal to
        :meth:`kv` up to float rounding.

        Args:
            layers: the late layers, consecutive (``S+1 .. L-1``).
            h: ``[batch, N, d]`` split state of every row.
            weights: ``[len(layers), f, d]`` (``f = d`` or ``2d``) or ``None`` (identity); biases:
                ``[len(layers), d]`` or ``None`` (model dtype and device).
            rope: RoPE tables of the rows ``start .. stop-1`` (``cos``/``sin`` ``[1, stop-start, head_dim]``).
            keys, values: per late layer ``[batch, kv_heads, N, head_dim]`` buffers (position-indexed), written
                in place at rows ``start .. stop-1``.
            start, stop: the rows, ``0 ≤ start < stop ≤ N``.

        Raises:
            ValueError: shapes disagree, or the late layers use different norm epsilons.
        """
        late, (bsz, n, d) = len(layers), h.shape
        want = (bsz, self.num_kv_heads, n, self.head_dim)
        if len(keys) != late or len(values) != late or any(tuple(t.shape) != want for t in (*keys, *values)):
            raise ValueError(f"fill_kv outputs must be {late} buffers of {want} each")
        if not 0 <= start < stop <= n or rope.cos.shape[1] != stop - start:
            raise ValueError(f"fill_kv rows {start}..{stop - 1} must lie in 0..{n - 1}, with RoPE tables for them")
        if weights is not None and (weights.ndim != 3 or tuple(weights.shape[::2]) != (late, d)
                                    or weights.shape[1] not in (d, 2 * d) or biases is None
                                    or tuple(biases.shape) != (late, d)):
            raise ValueError(f"fill_kv maps must be [{late}, d or 2d, {d}] and [{late}, {d}]; got "
                             f"{tuple(weights.shape)} and {None if biases is None else tuple(biases.shape)}")
        wkv, bkv, eps = self._folded_kv(layers)
        kvd, half = self.num_kv_heads * self.head_dim, self.head_dim // 2
        context = weights is not None and weights.shape[1] == 2 * d
        step = max(1, self.fill_chunk_bytes // ((d + 2 * kvd) * h.element_size()))
        for i in range(late):
            for b in range(bsz):
                for r0 in range(start, stop, step):
                    r1 = min(stop, r0 + step)
                    hc = h[b, r0:r1]  # [m, d]
                    if weights is None:  # identity: x̂_l = h
                        xh = hc
                    else:
                        xh = torch.addmm(biases[i], hc, weights[i, :d])
                        if context:  # + h_S(t−1) W'_l, with h_S(−1) = 0
                            lo = max(r0, 1)
                            if lo < r1:
                                xh[lo - r0:].addmm_(h[b, lo - 1:r1 - 1], weights[i, d:])
                    rms = torch.linalg.vector_norm(xh, dim=-1, keepdim=True, dtype=torch.float32)
                    kv = torch.mm(xh, wkv[i])  # [m, 2·kv_dim]
                    del xh
                    kv.mul_(torch.rsqrt(rms.square_().div_(d).add_(eps)).to(h.dtype))
                    if bkv is not None:
                        kv.add_(bkv[i])
                    k = kv[:, :kvd].unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(0, 1)  # [kvh, m, hd]
                    v = kv[:, kvd:].unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(0, 1)
                    values[i][b, :, r0:r1].copy_(v)
                    # RoPE (x·cos + rotate_half(x)·sin) by halves, written into the keys: no temporaries
                    cos, sin = rope.cos[0, r0 - start:r1 - start], rope.sin[0, r0 - start:r1 - start]  # [m, hd]
                    out = keys[i][b, :, r0:r1]
                    k1, k2, o1, o2 = k[..., :half], k[..., half:], out[..., :half], out[..., half:]
                    torch.mul(k1, cos[:, :half], out=o1)
                    o1.addcmul_(k2, sin[:, :half], value=-1)
                    torch.mul(k2, cos[:, half:], out=o2)
                    o2.addcmul_(k1, sin[:, half:])

    def visible_keys(self, layer: int, positions: Tensor, num_keys: int,
                     visible: Tensor | None, first_key: int = 0) -> Tensor | None:
        """Boolean attention mask ``[rows, num_keys]`` over the keys at positions ``first_key ..
        first_key + num_keys - 1``: key ``j`` is visible to the row at position ``p`` iff ``j <= p`` (and
        ``visible[j]``, ``visible`` over absolute positions). ``None`` means plain causal over all rows."""
        if visible is None and first_key == 0 and positions.numel() == num_keys:
            return None  # all rows, in order: SDPA's causal kernel
        keys = torch.arange(first_key, first_key + num_keys, device=positions.device)
        mask = keys[None, :] <= positions[:, None]
        if visible is not None:
            mask &= visible[first_key:first_key + num_keys][None, :]
        return mask

    def attend(self, layer: int, q: Tensor, positions: Tensor, keys: Tensor, values: Tensor,
               visible: Tensor | None, *, host: np.ndarray | None = None) -> Tensor:
        """Causal attention of queries ``q`` ``[batch, heads, rows, head_dim]`` (after RoPE) at
        ``positions`` ``[rows]`` (``host``: the same, sorted, on the host) to the position-indexed
        ``keys``/``values`` ``[batch, kv_heads, P, head_dim]`` (restricted to ``visible`` ``[P]`` when
        given); ``[batch, heads, rows, head_dim]``. Sliding-window models override it
        (:class:`~ridgefill.adapters.parts.SlidingWindows`)."""
        mask = self.visible_keys(layer, positions, keys.shape[2], visible)
        gqa = self.num_heads != self.num_kv_heads
        if mask is None:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.scaling, enable_gqa=gqa)
        # Exact rows spread over the prompt (row selection, a short tail): a block of rows reads only the
        # keys up to its latest row, so each row costs about its causal share (p + 1 keys), not the prompt.
        block = self.query_block
        rows = positions.numel()
        host = host_positions(positions, host)
        ends = [int(host[start:start + block].max()) + 1 for start in range(0, rows, block)]  # rows in any order
        outs = [F.scaled_dot_product_attention(
                    q[:, :, start:start + block], keys[:, :, :hi], values[:, :, :hi],
                    attn_mask=mask[start:start + block, :hi], scale=self.scaling, enable_gqa=gqa)
                for start, hi in zip(range(0, rows, block), ends)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def layer(self, layer: int, x: Tensor, rope: Rope, positions: Tensor, keys: Tensor,
              values: Tensor, visible: Tensor | None = None, *, host: np.ndarray | None = None) -> Tensor:
        block = self.body.layers[layer]
        q, k, v = self.project_qkv(layer, block.input_layernorm(x))
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        write_rows(keys, values, positions, k, v)
        out = self.attend(layer, q, positions, keys, values, visible, host=host)
        b, _, r, _ = out.shape
        x = x + block.self_attn.o_proj(out.transpose(1, 2).reshape(b, r, -1))
        return x + block.mlp(block.post_attention_layernorm(x))

    def logits(self, x: Tensor) -> Tensor:
        return self.model.lm_head(self.body.norm(x))
