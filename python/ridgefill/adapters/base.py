"""What RidgeFill needs of a decoder-only language model, one decoder layer at a time.

An adapter wraps a Hugging Face causal LM and exposes, per layer ``l``:

- :meth:`DecoderAdapter.kv`: the layer's cache entries for given rows from their layer input
  (input norm, K/V projections, RoPE at the rows' absolute positions). This is all a *filled*
  row computes in a late layer.
- :meth:`DecoderAdapter.layer`: the full layer forward for a set of rows at given absolute
  positions, which writes their K/V into the layer's key/value buffers and attends causally
  to whatever those buffers hold (exact rows attending to the mixed cache).

A new architecture is a new subclass overriding the few methods that differ (see
:mod:`ridgefill.adapters.families`: Qwen2's biases need nothing, Qwen3 adds q/k norms, Phi-3 splits a
fused QKV projection, Mistral and Qwen2/Qwen3 may have sliding windows), Gemma 3 (:mod:`ridgefill.adapters.gemma3`) also has
sliding-window layers, per-layer-type RoPE and extra norms (overrides ``rope``, ``kv``, ``layer``,
``visible_keys``, :meth:`needed_filled_rows`), recurrent-state layers replace the K/V buffers by a
state update.

:meth:`DecoderAdapter.rope` returns the RoPE tables of some rows as an object that the same adapter's
``kv`` and ``layer`` understand and that has ``rows(index)`` (the tables of a subset of the rows): a
:class:`Rope` for models with one RoPE (Llama), a :class:`RopeByType` (one :class:`Rope` per layer type)
for models whose layer types use different RoPE bases (Gemma 3: local base in sliding-window layers,
global base in full-attention layers).

:meth:`DecoderAdapter.needed_filled_rows` says which filled rows' K/V a late layer can ever read
(all of them, except in sliding-window layers), and :meth:`DecoderAdapter.build_cache` turns the
per-layer K/V buffers into the ``transformers`` cache that decoding continues from.

Shapes: hidden states ``[batch, rows, hidden]``; keys/values ``[batch, kv_heads, positions,
head_dim]`` where the position axis is indexed by absolute position; positions are ``int64``
tensors ``[rows]``, shared by the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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


@dataclass(frozen=True)
class RopeByType:
    """RoPE tables for some absolute positions, one :class:`Rope` per layer type.

    ``tables`` maps a layer type (e.g. ``"sliding_attention"``, ``"full_attention"``) to the tables
    ``[1, rows, head_dim]`` of that type; all are for the same rows.
    """

    tables: dict[str, Rope]

    def rows(self, index: Tensor | slice) -> "RopeByType":
        """The tables of every layer type for a subset of the rows they were made for."""
        return RopeByType({t: r.rows(index) for t, r in self.tables.items()})

    def __getitem__(self, layer_type: str) -> Rope:
        try:
            return self.tables[layer_type]
        except KeyError:
            raise KeyError(f"no RoPE tables for layer type {layer_type!r}; have {sorted(self.tables)}") from None


def record_sliding_windows(cache) -> None:
    """Make the sliding-window layers of a ``transformers`` cache keep every row they are given.

    ``DynamicSlidingWindowLayer`` normally keeps the last ``window - 1`` rows, so ``cache.crop(-1)``
    (which :func:`ridgefill.fill.generate_after` needs, to let ``generate`` recompute the last prompt
    row) fails once the window is full, and the row the recomputed last row needs first is gone.
    With past recording on, the layer keeps all rows until :func:`trim_sliding_windows`. Layers
    without a sliding window are left alone. Call it on an empty cache, before any update.
    """
    for layer in getattr(cache, "layers", ()):
        if getattr(layer, "is_sliding", False) and hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()


def trim_sliding_windows(cache) -> None:
    """Keep only the last ``window`` rows of each sliding-window layer of a ``transformers`` cache.

    That is one row more than ``transformers`` keeps after a prefill: after ``cache.crop(-1)`` the
    layer holds the ``window - 1`` rows before the last prompt row, exactly what the recomputed last
    row attends to besides itself. The sequence length (``cumulative_length``) is unchanged and the
    kept rows are copied, so the memory of the older rows is freed.
    """
    for layer in getattr(cache, "layers", ()):
        window = getattr(layer, "sliding_window", None)
        if not getattr(layer, "is_sliding", False) or window is None or layer.keys is None:
            continue
        if layer.keys.shape[-2] > window:
            layer.keys = layer.keys[:, :, -window:].clone()
            layer.values = layer.values[:, :, -window:].clone()


def adopt_rows(cache, layer: int, keys: Tensor, values: Tensor) -> None:
    """Put ``keys``/``values`` ``[batch, kv_heads, rows, head_dim]`` into layer ``layer`` of an empty
    ``transformers`` cache as its first rows, without a copy where the layer is a plain ``DynamicLayer`` (its
    ``update`` would concatenate them onto an empty tensor, doubling the cache's memory for a moment); other
    layer types (sliding windows) go through their own ``update``."""
    from transformers.cache_utils import DynamicLayer

    entry = cache.layers[layer] if layer < len(getattr(cache, "layers", ())) else None
    if type(entry) is DynamicLayer and not entry.is_initialized:
        entry.lazy_initialization(keys, values)
        entry.keys, entry.values = keys, values
    else:
        cache.update(keys, values, layer)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotate ``x`` ``[batch, heads, rows, head_dim]`` by the RoPE tables of its rows.

    With partial rotary embeddings (tables narrower than ``head_dim``, e.g. Phi-3 configs with
    ``partial_rotary_factor < 1``) only the first ``rotary_dim`` channels rotate and the rest pass
    through, as in ``transformers``' ``apply_rotary_pos_emb``."""
    cos, sin = rope.cos.unsqueeze(1), rope.sin.unsqueeze(1)
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def host_positions(positions: Tensor, host: np.ndarray | None) -> np.ndarray:
    """``host`` (sorted ``int64`` positions on the host) when given, else ``positions`` read to the host
    (one host synchronisation on an accelerator; :func:`ridgefill.prefill` always passes ``host``)."""
    return positions.cpu().numpy() if host is None else host


def write_rows(keys: Tensor, values: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
    """Write ``k``/``v`` ``[batch, kv_heads, rows, head_dim]`` into ``keys``/``values`` ``[batch,
    kv_heads, P, head_dim]`` at ``positions`` ``[rows]`` (a plain copy when the rows are all ``P``)."""
    if positions.numel() == keys.shape[2]:
        keys.copy_(k)
        values.copy_(v)
    else:
        keys[:, :, positions] = k
        values[:, :, positions] = v


class DecoderAdapter:
    """Per-layer access to a decoder-only LM for the fill prefill (see module docstring)."""

    model_types: tuple[str, ...] = ()
    #: layers that keep a recurrent state instead of K/V (hybrid models, :mod:`ridgefill.adapters.hybrid`)
    recurrent_layers: tuple[int, ...] = ()

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
        """RoPE tables for absolute ``positions`` ``[rows]``, in the dtype/device of ``like``: a
        :class:`Rope` or another object with ``rows(index)`` that this adapter's :meth:`kv` and
        :meth:`layer` take (e.g. :class:`RopeByType`)."""
        raise NotImplementedError

    def kv(self, layer: int, x: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        """Cache entries of ``layer`` for rows whose layer input is ``x`` ``[batch, rows, hidden]``:
        keys (after RoPE) and values, each ``[batch, kv_heads, rows, head_dim]``."""
        raise NotImplementedError

    def layer(self, layer: int, x: Tensor, rope: Rope, positions: Tensor, keys: Tensor,
              values: Tensor, visible: Tensor | None = None, *, host: np.ndarray | None = None) -> Tensor:
        """Full forward of ``layer`` for rows ``x`` ``[batch, rows, hidden]`` at ``positions``.

        Writes the rows' keys/values into ``keys``/``values`` ``[batch, kv_heads, P, head_dim]`` at
        their positions (in place), then each row attends to the entries at positions ``<=`` its
        own, restricted to ``visible`` ``[P]`` (bool) when given. ``host``: the same sorted positions as a
        host ``int64`` array, from which the attention's blocks are sized without reading the device
        (:func:`host_positions`). Returns the layer output, the same shape as ``x``.
        """
        raise NotImplementedError

    def logits(self, x: Tensor) -> Tensor:
        """Final norm and LM head on hidden states ``[batch, rows, hidden]`` -> ``[batch, rows, vocab]``."""
        raise NotImplementedError

    def key_range(self, layer: int, positions: np.ndarray, num_keys: int) -> tuple[int, int]:
        """``(lo, hi)``: the keys ``lo .. hi-1`` that rows at the sorted host ``positions`` can see in ``layer``
        (``0 .. max + 1`` with causal attention; sliding-window layers see less far back)."""
        return 0, min(num_keys, int(positions[-1]) + 1)

    def needed_filled_rows(self, layer: int, filled_positions: np.ndarray,
                           exact_positions: np.ndarray) -> np.ndarray | None:
        """Which filled rows' K/V ``layer`` can ever read: ``None`` for all of them, else the sorted
        ``int64`` indices ``[k]`` into ``filled_positions`` of those that are needed. Host arrays in and out.

        Args:
            filled_positions: sorted ``int64`` ``[F]``, the filled rows' absolute positions.
            exact_positions: sorted ``int64`` ``[E]``, the exact rows (the last prompt row among them).

        A filled row's K/V in a late layer are read only by exact rows attending to it and by later
        decoding steps. With full causal attention every filled row is read (the last prompt row,
        which is exact, sees all of them), so the default returns ``None``. Sliding-window layers
        override it: there a row older than the window of every exact row at or after it is never
        read, neither in the prefill nor in decoding (decoding steps see less far back than the last
        prompt row). :func:`ridgefill.fill.prefill` computes no K/V for the rows left out and leaves
        zeros in their place; they do not reach the returned cache (see :meth:`build_cache`).
        """
        return None

    def is_recurrent(self, layer: int) -> bool:
        """Whether ``layer`` keeps a recurrent state instead of K/V (``False`` unless a hybrid adapter
        says so; see :class:`~ridgefill.adapters.hybrid.HybridAdapter` for ``new_state``,
        ``advance_state`` and ``check_exact_rows``)."""
        return layer in self.recurrent_layers

    def new_cache(self):
        """An empty ``transformers`` cache for this model."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def build_cache(self, keys: list[Tensor], values: list[Tensor]):
        """The ``transformers`` cache holding ``keys[l]``/``values[l]`` ``[batch, kv_heads, rows,
        head_dim]`` (rows in position order) for every layer ``l``, ready for decoding.

        Sliding-window layers keep their last ``window`` rows (:func:`trim_sliding_windows`), one
        more than ``transformers`` keeps, so that ``cache.crop(-1)`` works before ``generate``.
        """
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise ValueError(f"build_cache needs K/V for all {self.num_layers} layers; got "
                             f"{len(keys)} keys and {len(values)} values")
        cache = self.new_cache()
        record_sliding_windows(cache)
        for layer, (k, v) in enumerate(zip(keys, values)):
            adopt_rows(cache, layer, k, v)
        trim_sliding_windows(cache)
        return cache
