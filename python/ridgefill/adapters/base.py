"""What RidgeFill needs of a decoder-only language model, one decoder layer at a time.

An adapter wraps a Hugging Face causal LM and exposes, per layer ``l``:

- :meth:`DecoderAdapter.kv`: the layer's cache entries for given rows from their layer input
  (input norm, K/V projections, RoPE at the rows' absolute positions). This is all a *filled*
  row computes in a late layer.
- :meth:`DecoderAdapter.layer`: the full layer forward for a set of rows at given absolute
  positions, which writes their K/V into the layer's key/value buffers and attends causally
  to whatever those buffers hold (exact rows attending to the mixed cache).

A new architecture is a new subclass overriding the few methods that differ: Qwen2/Qwen3 add
q/k norms (override :meth:`project_qkv`), Gemma 3 has sliding-window layers (override
:meth:`visible_keys`), recurrent-state layers replace the K/V buffers by a state update.

Shapes: hidden states ``[batch, rows, hidden]``; keys/values ``[batch, kv_heads, positions,
head_dim]`` where the position axis is indexed by absolute position; positions are ``int64``
tensors ``[rows]``, shared by the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Rope:
    """Rotary embedding tables ``cos``/``sin`` ``[1, rows, head_dim]`` for some absolute positions."""

    cos: Tensor
    sin: Tensor

    def rows(self, index: Tensor | slice) -> "Rope":
        """The tables for a subset of the rows they were made for."""
        return Rope(self.cos[:, index], self.sin[:, index])


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotate ``x`` ``[batch, heads, rows, head_dim]`` by the RoPE tables of its rows."""
    cos, sin = rope.cos.unsqueeze(1), rope.sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DecoderAdapter:
    """Per-layer access to a decoder-only LM for the fill prefill (see module docstring)."""

    model_types: tuple[str, ...] = ()

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.config = model.config
        self.num_layers: int = self.config.num_hidden_layers
        self.hidden_size: int = self.config.hidden_size

    # --- hooks a subclass provides -------------------------------------------------------
    def embed(self, input_ids: Tensor) -> Tensor:
        """Token embeddings ``[batch, rows, hidden]`` (the input of layer 0)."""
        raise NotImplementedError

    def rope(self, positions: Tensor, like: Tensor) -> Rope:
        """RoPE tables for absolute ``positions`` ``[rows]``, in the dtype/device of ``like``."""
        raise NotImplementedError

    def kv(self, layer: int, x: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        """Cache entries of ``layer`` for rows whose layer input is ``x`` ``[batch, rows, hidden]``:
        keys (after RoPE) and values, each ``[batch, kv_heads, rows, head_dim]``."""
        raise NotImplementedError

    def layer(self, layer: int, x: Tensor, rope: Rope, positions: Tensor, keys: Tensor,
              values: Tensor, visible: Tensor | None = None) -> Tensor:
        """Full forward of ``layer`` for rows ``x`` ``[batch, rows, hidden]`` at ``positions``.

        Writes the rows' keys/values into ``keys``/``values`` ``[batch, kv_heads, P, head_dim]`` at
        their positions (in place), then each row attends to the entries at positions ``<=`` its
        own, restricted to ``visible`` ``[P]`` (bool) when given. Returns the layer output, the same
        shape as ``x``.
        """
        raise NotImplementedError

    def logits(self, x: Tensor) -> Tensor:
        """Final norm and LM head on hidden states ``[batch, rows, hidden]`` -> ``[batch, rows, vocab]``."""
        raise NotImplementedError

    def new_cache(self):
        """An empty ``transformers`` cache for this model."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)
