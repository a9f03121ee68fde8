"""Prefix caching with the fill: the hash of a KV block carries which of its rows are filled.

vLLM's prefix cache finds a block by a hash of its tokens chained over the blocks before it, plus extra
keys (LoRA, multimodal inputs, cache salt). A block that holds filled rows holds predicted late-layer K/V,
which equals neither the exact model's nor the K/V of a request that makes those rows exact. The plugin adds
one extra key to every block with filled rows (:func:`fill_block_key`): the maps' identity, the tail, and
how many of the block's rows are filled (filled rows are a prefix of the prompt, positions
``p < P − tail``). Two requests then share a block only when they fill the same rows of it after the same
prefix: a block is never served to a request that would compute its rows exactly, nor to one with other
maps or another tail. Because hashes chain, every block after one with filled rows also differs from the
exact model's, whose later layers attend to exact K/V.

With row selection on, the rows a request makes exact depend on its whole prompt (the question at its end
chooses them), and selection rewrites the chosen rows' K/V in the request's blocks when its last prompt
token is scheduled. A block with filled rows then also carries the request's id: it is the request's own
(a preempted request recomputed later finds it), and it is not shared with other requests. Prompts within
their tail (all rows exact) share blocks as with the exact model. Prefix caching across requests that
share a long prefix needs ``"select": "off"``.

The hook is installed by :func:`ridgefill_vllm.register` in every vLLM process; it reads the engine's model
config when the engine core sets up its KV cache (``EngineCore._initialize_kv_caches``), before any request
is hashed.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

#: Exact tokens per prompt when the config gives no ``tail``.
DEFAULT_TAIL = 256

#: ``(maps identity, tail, selection on)`` of the engine served with maps in this process, or ``None``.
_ENGINE_FILL: tuple[str, int, bool] | None = None


def maps_identity(path: str) -> str:
    """The first 16 hex digits of the SHA-256 of a maps file's safetensors header (its metadata: model,
    split, λ per layer, calibration text; and the tensors' layout), or of the path when it cannot be read
    (the model then refuses the file at load with the reason)."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = f.read(min(n, 100_000_000))
    except (OSError, struct.error):
        header = str(path).encode()
    return hashlib.sha256(header).hexdigest()[:16]


def set_engine_fill(model_config) -> None:
    """Record the fill the engine serves (from ``hf_config.ridgefill``), or ``None`` without maps."""
    global _ENGINE_FILL
    from . import serves_fill
    from .maps import resolve_maps_path
    from .selection import engine_selects

    if not serves_fill(model_config):
        _ENGINE_FILL = None
        return
    cfg = model_config.hf_config.ridgefill
    tail = cfg.get("tail", DEFAULT_TAIL)
    path = resolve_maps_path(cfg["maps"], model_config.model)
    _ENGINE_FILL = (maps_identity(path), tail, engine_selects(cfg, path)) if isinstance(tail, int) else None


def fill_block_key(num_prompt: int, start: int, end: int, ident: str, tail: int,
                   request_id: str | None = None) -> tuple | None:
    """The extra hash key of the block of positions ``[start, end)`` of a request with a ``num_prompt``-token
    prompt: ``("ridgefill", ident, tail, n)`` with ``n ≥ 1`` the block's filled rows, followed by
    ``request_id`` when row selection is on (the rows it makes exact depend on the whole prompt, so such a
    block is the request's own), or ``None`` when none of its rows is filled."""
    n = min(max(num_prompt - tail - start, 0), end - start)
    if n == 0:
        return None
    return ("ridgefill", ident, tail, n) + ((request_id,) if request_id is not None else ())


def install_prefix_cache_hook() -> bool:
    """Wrap vLLM's ``generate_block_hash_extra_keys`` (where the request hasher and the block pool call it)
    to add :func:`fill_block_key`, and ``EngineCore._initialize_kv_caches`` to record the engine's fill.
    Safe to call more than once. Returns whether the hook is installed."""
    try:
        from vllm.v1.core import block_pool, kv_cache_utils
        from vllm.v1.engine.core import EngineCore
    except ImportError:
        return False
    original = kv_cache_utils.generate_block_hash_extra_keys
    if getattr(original, "_ridgefill", False):
        return True

    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, start_mm_idx)
        if _ENGINE_FILL is not None:
            ident, tail, selects = _ENGINE_FILL
            key = fill_block_key(request.num_prompt_tokens, start_token_idx, end_token_idx, ident, tail,
                                 request.request_id if selects else None)
            if key is not None:
                keys = (*(keys or ()), key)
        return keys, next_mm_idx

    generate_block_hash_extra_keys._ridgefill = True
    kv_cache_utils.generate_block_hash_extra_keys = generate_block_hash_extra_keys
    block_pool.generate_block_hash_extra_keys = generate_block_hash_extra_keys

    init = EngineCore._initialize_kv_caches

    def _initialize_kv_caches(self, vllm_config, *args, **kwargs):
        set_engine_fill(vllm_config.model_config)
        return init(self, vllm_config, *args, **kwargs)

    EngineCore._initialize_kv_caches = _initialize_kv_caches
    return True
