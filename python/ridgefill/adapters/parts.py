"""Layer parts shared by several adapters, as mixins placed before :class:`~ridgefill.adapters.LlamaAdapter`
in a subclass's bases.

- :class:`QKNorm`: per-head RMSNorm of queries and keys (``q_norm``, ``k_norm``) applied after the
  projections and *before* RoPE, so the cache holds ``rope(k_norm(k_proj(input_layernorm(x))))``
  (Gemma 3, Qwen3, Qwen3-MoE; ``transformers``' ``modeling_gemma3.py``, ``modeling_qwen3.py``).
- :class:`SlidingWindows`: layers of type ``"sliding_attention"`` in which the row at position ``p``
  sees only keys at positions in ``(p - window, p]`` (the mask of ``transformers``'
  ``create_sliding_window_causal_mask``); other layers are plain causal. Used by Gemma 3 (alternating
  layers), Qwen2/Qwen3 (``use_sliding_window``: layers from ``max_window_layers`` on), Mistral and
  Phi-3 (every layer when ``config.sliding_window`` is set).

Shapes as in :mod:`ridgefill.adapters.base`: hidden states ``[batch, rows, hidden]``, K/V ``[batch,
kv_heads, positions, head_dim]`` indexed by absolute position, positions ``int64`` ``[rows]``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import host_positions

from ..errors import UnsupportedModelError

SLIDING = "sliding_attention"
FULL = "full_attention"


class QKNorm:
    """Queries and keys go through the layer's ``q_norm`` / ``k_norm`` (per head) before RoPE.

    The batched filled-row path :meth:`~ridgefill.adapters.LlamaAdapter.fill_kv` has no k-norm, so an
    adapter with this mixin reports ``supports_fill_kv() == False`` (it overrides ``project_kv``) and the
    fill computes the filled rows' K/V layer by layer with :meth:`kv`.
    """

    def project_qkv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K (after ``q_norm``/``k_norm``, before RoPE) and V ``[batch, heads, rows, head_dim]``."""
        q, k, v = super().project_qkv(layer, h)
        attn = self.body.layers[layer].self_attn
        return attn.q_norm(q), attn.k_norm(k), v

    def project_kv(self, layer: int, h: Tensor) -> tuple[Tensor, Tensor]:
        """K (after ``k_norm``, before RoPE) and V from the normed input ``h``, one fused matmul."""
        k, v = super().project_kv(layer, h)
        return self.body.layers[layer].self_attn.k_norm(k), v


def layer_types_of(config) -> list[str]:
    """The attention type of each layer as ``transformers`` builds the masks and the cache for it:
    ``config.layer_types`` when the config has it, else every layer ``"sliding_attention"`` when
    ``config.sliding_window`` is set (Mistral, Phi-3, Qwen3-MoE) and ``"full_attention"`` otherwise."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return list(types)
    window = getattr(config, "sliding_window", None)
    return [SLIDING if window is not None else FULL] * config.num_hidden_layers


class SlidingWindows:
    """Sliding-window attention in the layers of type ``"sliding_attention"`` (see module docstring).

    Call :meth:`init_windows` in ``__init__``. Sliding layers attend block by block (query rows in
    blocks of ``attention_block`` rows, each against the keys its window can reach), so a prefill of
    ``N`` rows costs ``O(N * window)`` there and never builds an ``[N, N]`` mask. In a sliding layer a
    filled row is read only if some exact row at or after it lies within its window
    (:meth:`needed_filled_rows`).
    """

    layer_types: list[str]
    sliding_window: int | None
    attention_block: int

    def init_windows(self, types: list[str], window) -> None:
        """Check and store the layer types ``[num_layers]`` and the window.

        Raises:
            UnsupportedModelError: a layer type other than ``"sliding_attention"`` / ``"full_attention"``,
                the wrong number of types, or a sliding layer without a positive int window.
        """
        cfg = self.model.config
        types = list(types or [])
        if len(types) != cfg.num_hidden_layers or set(types) - {SLIDING, FULL}:
            raise UnsupportedModelError(
                f"config.layer_types must list {SLIDING!r} or {FULL!r} for each of the {cfg.num_hidden_layers} "
                f"layers; got {types}")
        if SLIDING in types and (not isinstance(window, int) or window < 1):
            raise UnsupportedModelError(f"config.sliding_window must be a positive int; got {window!r}")
        self.layer_types = types
        self.sliding_window = window if SLIDING in types else None
        self.attention_block = max(window or 0, 256) if SLIDING in types else 256

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` is a sliding-window layer."""
        return self.layer_types[layer] == SLIDING

    def visible_keys(self, layer: int, positions: Tensor, num_keys: int,
                     visible: Tensor | None, first_key: int = 0) -> Tensor | None:
        """Boolean mask ``[rows, num_keys]`` over the keys at positions ``first_key ..
        first_key + num_keys - 1``: key ``j`` is visible to the row at position ``p`` iff ``j <= p``,
        in sliding layers also ``j > p - sliding_window``, and ``visible[j]`` when given (``visible``
        ``[first_key + num_keys]`` or longer, over absolute positions). ``None`` means plain causal over
        all rows (full layers only)."""
        if not self.is_sliding(layer) and first_key == 0:
            return super().visible_keys(layer, positions, num_keys, visible)
        keys = torch.arange(first_key, first_key + num_keys, device=positions.device)
        mask = keys[None, :] <= positions[:, None]
        if self.is_sliding(layer):
            mask &= keys[None, :] > positions[:, None] - self.sliding_window
        if visible is not None:
            mask &= visible[first_key:first_key + num_keys][None, :]
        return mask

    def attend(self, layer: int, q: Tensor, positions: Tensor, keys: Tensor, values: Tensor,
               visible: Tensor | None, *, host: np.ndarray | None = None) -> Tensor:
        """Attention of queries ``q`` ``[batch, heads, rows, head_dim]`` at sorted ``positions`` (``host``:
        the same on the host) to the position-indexed ``keys``/``values``; ``[batch, heads, rows, head_dim]``.

        Raises:
            ValueError: in a sliding layer, positions not strictly increasing.
        """
        if not self.is_sliding(layer):
            return super().attend(layer, q, positions, keys, values, visible, host=host)
        host = host_positions(positions, host)
        if host.size > 1 and bool((host[1:] <= host[:-1]).any()):
            raise ValueError("sliding-window attention needs strictly increasing positions")
        gqa = self.num_heads != self.num_kv_heads
        block = self.attention_block
        outs = []
        for start in range(0, host.size, block):
            pos = positions[start:start + block]
            lo = max(int(host[start]) - self.sliding_window + 1, 0)
            hi = int(host[min(start + block, host.size) - 1]) + 1
            mask = self.visible_keys(layer, pos, hi - lo, visible, first_key=lo)
            outs.append(F.scaled_dot_product_attention(
                q[:, :, start:start + block], keys[:, :, lo:hi], values[:, :, lo:hi], attn_mask=mask,
                scale=self.scaling, enable_gqa=gqa))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def key_range(self, layer: int, positions: np.ndarray, num_keys: int) -> tuple[int, int]:
        """``(lo, hi)``: the keys rows at the sorted host ``positions`` can see; in a sliding layer from
        ``positions[0] − window + 1``."""
        lo = max(int(positions[0]) - self.sliding_window + 1, 0) if self.is_sliding(layer) else 0
        return lo, min(num_keys, int(positions[-1]) + 1)

    def needed_filled_rows(self, layer: int, filled_positions: np.ndarray,
                           exact_positions: np.ndarray) -> np.ndarray | None:
        """In a sliding layer, the indices into ``filled_positions`` ``[F]`` of the filled rows some
        exact row sees: a filled row at ``f`` is needed iff an exact row lies in ``[f, f + window)``
        (``exact_positions`` sorted, ``[E]``); ``None`` when that is every filled row, and in full
        layers. Decoding steps come after the last prompt row, which is exact, and see no further
        back than it.

        Raises:
            ValueError: no exact rows.
        """
        if not self.is_sliding(layer):
            return None
        exact_positions, filled_positions = np.asarray(exact_positions), np.asarray(filled_positions)
        if exact_positions.size == 0:
            raise ValueError("needed_filled_rows: there must be at least one exact row (the last prompt row)")
        nxt = np.searchsorted(exact_positions, filled_positions)  # first exact row at or after f
        has_next = nxt < exact_positions.size
        nearest = exact_positions[np.minimum(nxt, exact_positions.size - 1)]
        need = has_next & (nearest < filled_positions + self.sliding_window)
        if need.all():
            return None
        return np.flatnonzero(need)
