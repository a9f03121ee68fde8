"""What the fill keeps per KV block, reserved when vLLM sizes its KV pool.

vLLM gives the KV cache the memory left after its profiling of the model (``gpu_memory_utilization``), or the
amount set by ``kv_cache_memory_bytes`` (``VLLM_CPU_KVCACHE_SPACE`` on CPU), and divides it into blocks of
``B`` bytes (every layer's K/V of ``block_size`` tokens). The fill keeps, for the whole pool, what a later step reads
(:func:`fill_bytes_per_block`: ``E`` bytes per block): with row selection every token's split state ``h_S``
(:class:`ridgefill_vllm.selection.SplitStates`), for the plain fill the carried split states of context maps
(:class:`ridgefill_vllm.plan.CarriedStates`). :func:`install_memory_hook` makes vLLM divide that memory into blocks
of ``B + E`` bytes, so the pool has ``⌊memory / (B + E)⌋`` blocks and the fill's states fit in the rest; the checks of
whether ``max_model_len`` fits count ``B + E`` per block too. With ``num_gpu_blocks_override`` the pool keeps that
number of blocks.
"""

from __future__ import annotations

import torch

#: Bytes of the slot tag kept beside each carried split state (int64).
_TAG_BYTES = 8


def fill_bytes_per_block(vllm_config, block_size: int) -> int:
    """``E``: bytes the fill keeps per KV block of ``block_size`` tokens for the engine ``vllm_config`` serves: with row
    selection (:func:`~ridgefill_vllm.selection.engine_selects`: ``"auto"`` as the maps record) ``block_size · d`` values of the model dtype (``h_S`` by KV slot), for the plain fill ``d`` values and an
    int64 slot (one carried ``h_S`` per block; reserved whether or not the maps read context), 0 without maps.
    ``d``: the hidden size, the same on every tensor-parallel rank (the split states are not sharded)."""
    from . import serves_fill
    from .maps import resolve_maps_path
    from .selection import engine_selects

    model_config = vllm_config.model_config
    if not serves_fill(model_config):
        return 0
    d = model_config.get_hidden_size()
    value = torch.empty(0, dtype=model_config.dtype).element_size()
    cfg = model_config.hf_config.ridgefill
    if not engine_selects(cfg, resolve_maps_path(cfg["maps"], model_config.model)):
        return d * value + _TAG_BYTES
    return block_size * d * value


def _block_size(kv_cache_groups) -> int:
    """The largest block size of the groups (the fill keeps its states by the slots of its first late attention
    layer's group)."""
    return max((getattr(g.kv_cache_spec, "block_size", 1) for g in kv_cache_groups), default=1)


#: The engine whose KV pool is being sized in this process (its ``VllmConfig``, recorded by the hook when the engine
#: core initializes its KV caches), or ``None``.
_ENGINE = None


def install_memory_hook() -> bool:
    """Wrap vLLM's KV-pool sizing (``vllm.v1.core.kv_cache_utils``: ``get_kv_cache_config_from_groups``, which divides
    the memory into blocks, and ``_pool_bytes_per_block``, which the override, the null block and the
    ``max_model_len`` checks count with) so that each block counts ``B + E`` bytes (:func:`fill_bytes_per_block`), and
    ``EngineCore._initialize_kv_caches`` to record the engine being sized. ``_pool_bytes_per_block`` takes
    ``(kv_cache_groups)`` in vLLM 0.31 and ``(vllm_config, kv_cache_groups)`` in 0.32. Safe to call more than once.
    Returns whether the hook is installed (``False``: a vLLM without those functions)."""
    try:
        from vllm.v1.core import kv_cache_utils as kcu
        from vllm.v1.engine.core import EngineCore
    except ImportError:
        return False
    if not all(hasattr(kcu, name) for name in ("get_kv_cache_config_from_groups", "_pool_bytes_per_block")):
        return False
    config_from_groups, pool_bytes = kcu.get_kv_cache_config_from_groups, kcu._pool_bytes_per_block
    if getattr(config_from_groups, "_ridgefill", False):
        return True

    def extra(groups) -> int:
        return fill_bytes_per_block(_ENGINE, _block_size(groups)) if _ENGINE is not None and groups else 0

    def get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory):
        e = extra(kv_cache_groups)
        if e:
            b = pool_bytes(kv_cache_groups) if _one_argument(pool_bytes) else pool_bytes(vllm_config, kv_cache_groups)
            available_memory = available_memory // (b + e) * b  # the pool: ⌊memory / (B + E)⌋ blocks of B bytes
        return config_from_groups(vllm_config, kv_cache_groups, available_memory)

    def _pool_bytes_per_block(*args):
        return pool_bytes(*args) + extra(args[-1])

    init = EngineCore._initialize_kv_caches

    def _initialize_kv_caches(self, vllm_config, *args, **kwargs):
        global _ENGINE
        _ENGINE = vllm_config
        try:
            return init(self, vllm_config, *args, **kwargs)
        finally:
            _ENGINE = None

    get_kv_cache_config_from_groups._ridgefill = True
    kcu.get_kv_cache_config_from_groups = get_kv_cache_config_from_groups
    kcu._pool_bytes_per_block = _pool_bytes_per_block
    EngineCore._initialize_kv_caches = _initialize_kv_caches
    return True


def _one_argument(fn) -> bool:
    import inspect

    return len(inspect.signature(fn).parameters) == 1
