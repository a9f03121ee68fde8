"""An attention backend for the late layers: the platform's own backend, whose metadata builder
builds metadata for the exact tokens only and attaches the step's row plan.

vLLM builds attention metadata once per step for each group of layers sharing a backend class, so
the late layers (given this backend) get their own metadata: queries restricted to the exact tokens
(:func:`ridgefill_vllm.plan.subset_metadata`), with the row plan under the attribute
``ridgefill_plan`` (``None`` in steps without filled tokens, where the metadata is the full one).
The attention kernels, the KV-cache layout and the cache writes are the platform backend's own. With several
KV-cache groups (the hybrid KV-cache manager: one block table per group) each group's late layers get metadata
and a row plan built from that group's block table and slots.
"""

from __future__ import annotations

import functools

from .plan import make_plan, step_request_ids, step_requests, subset_metadata


@functools.cache
def fill_backend(underlying, tail: int, select: bool = False):
    """A subclass of the attention backend class ``underlying`` whose builder restricts the queries
    to the exact tokens of a step (those in the last ``tail`` positions of each prompt, every decoding
    token; :func:`ridgefill_vllm.plan.make_plan`)."""
    from vllm.v1.attention.backend import subclass_attention_backend

    base = underlying.get_builder_cls()

    class RidgeFillBuilder(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # vLLM reuses one KV-cache group's metadata for the next group of the same spec when the builder can
            # swap its block table (FlashAttention's ``update_block_table``): that copy would keep the first group's
            # row plan and slots, and the full block table beside a subset of queries. Each group builds its own.
            self.supports_update_block_table = False

        def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
            cm = common_attn_metadata
            computed, prompt = step_requests(cm.num_reqs)
            plan = make_plan(cm.query_start_loc_cpu, cm.slot_mapping, tail, computed, prompt,
                             cm.block_table_tensor, self.kv_cache_spec.block_size, select)
            if plan is not None:  # row selection builds metadata for other rows of the late layers
                plan.req_ids, plan.token_ids = step_request_ids()
                plan.common = cm
                plan.build = functools.partial(base.build, self, 0)
            if plan is not None and plan.exact.numel() > 0:  # without exact tokens the late layers attend to nothing
                cm = subset_metadata(cm, plan)
                common_prefix_len = 0  # no cascade attention over a subset of queries
            metadata = super().build(common_prefix_len, cm, fast_build)
            metadata.ridgefill_plan = plan
            return metadata

    return subclass_attention_backend(name_prefix=f"RidgeFillTail{tail}{'Select' if select else ''}", attention_backend_cls=underlying,
                                      builder_cls=RidgeFillBuilder)
