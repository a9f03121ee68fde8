"""A Llama (or Qwen3-Next) model config of a given shape and identity maps for it, for speed runs only.

Time to first token does not depend on the weights' values, so the GPU run (``scripts/gpu_vllm.sh``)
measures the Llama-3.1-8B shape without its weights: ``config.json`` (Llama 3.1 8B: 32 layers,
hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocabulary 128256, RoPE θ 500000 with llama3 scaling,
131072 positions), served by vLLM with ``load_format="dummy"`` (random weights, no checkpoint file),
plus a RidgeFill maps file at split ``S`` with ``W_l = I``, ``b_l = 0`` (the identity fill: the same
work per token as fitted maps). The outputs are meaningless text; never use them for quality.

``--family qwen3_next`` writes a Qwen3-Next-shaped config instead (``Qwen3NextForCausalLM``, the hybrid family:
Qwen3-Next-80B-A3B's layer shapes, 48 layers, linear attention with full attention every fourth layer, hidden
2048, 16 query heads and 2 KV heads of 256 with an output gate, linear attention with 16 key and 32 value heads of
128, top-10 routing over 32 experts of 512 plus a shared expert of 512 (the real model has 512 experts: 32 keep the
weights at about 7B parameters, 14 GB in bfloat16, so one GPU holds two engines), vocabulary 151936, 262144
positions); split 23 by default for it (late layers 24-47: 18 linear-attention and 6 full-attention layers).
Its sizes can be changed for a smaller run (a CPU run: docs/vllm.md, "Speed"): ``--layers``, ``--hidden``,
``--heads``, ``--kv-heads``, ``--head-dim`` (full attention), ``--linear-key-heads``, ``--linear-value-heads`` (of
128: vLLM's CPU kernel of the gated delta rule needs 128), ``--experts``, ``--experts-per-tok``,
``--moe-intermediate`` (each routed expert and the shared expert), ``--full-every`` (full attention at layers ``i``
with ``(i + 1) % full_every == 0``), ``--intermediate`` (``intermediate_size``: vLLM does not read it when every
layer is MoE; ``ridgefill.costs`` counts the MLP at it, so give the active width, ``experts_per_tok ·
moe_intermediate + moe_intermediate``, for a bound of that shape) and ``--vocab``. Sizes not given keep the
shape above; without ``--split`` the split is ``layers // 2 − 1``.

``--weights`` also saves random weights (``transformers``' initialization of the config's architecture, bfloat16
safetensors, seed 0) into ``OUT_DIR/model``, for platforms where the plugin cannot serve ``load_format="dummy"``:
on CPU vLLM repacks the QKV weights before the plugin copies the late layers' K/V rows (the plugin refuses it).
``transformers`` rewrites ``config.json`` in its own form (the same shape).

Usage: ``python scripts/make_shape_model.py OUT_DIR [--family llama|qwen3_next] [--split 15] [--layers 32 ...]``
(writes ``OUT_DIR/model/config.json`` and ``OUT_DIR/maps-S<split>.safetensors``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


# each family's default shape (module docstring); a size given on the command line replaces its entry
SHAPES = {
    "llama": dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=None, intermediate=14336, vocab=128256),
    "qwen3_next": dict(layers=48, hidden=2048, heads=16, kv_heads=2, head_dim=256, intermediate=5120, vocab=151936,
                       linear_key_heads=16, linear_value_heads=32, experts=32, experts_per_tok=10,
                       moe_intermediate=512, full_every=4),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--family", choices=tuple(SHAPES), default="llama")
    ap.add_argument("--split", type=int, default=None,
                    help="S (default 15; 23 for --family qwen3_next at 48 layers, else layers // 2 - 1)")
    for name in sorted({k for shape in SHAPES.values() for k in shape}):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                        help="default: " + ", ".join(f"{f} {shape[name] or 'hidden / heads'}"
                                                     for f, shape in SHAPES.items() if name in shape))
    ap.add_argument("--weights", action="store_true",
                    help="also save random bfloat16 weights (for CPU, where load_format='dummy' is refused)")
    args = ap.parse_args()
    for name, value in SHAPES[args.family].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    extra = sorted(k for k in vars(args) if getattr(args, k) is not None and k not in SHAPES[args.family]
                   and k not in ("out", "family", "split", "weights"))
    if extra:
        ap.error(f"--family {args.family} has no size {', '.join('--' + k.replace('_', '-') for k in extra)}")
    out = Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    if args.family == "qwen3_next":
        if args.split is None:
            args.split = 23 if args.layers == 48 else args.layers // 2 - 1
        cfg = qwen3_next_config(args)
    else:
        args.split = 15 if args.split is None else args.split
        cfg = llama_config(args)
    d = args.hidden
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    if args.weights:
        save_random_weights(model_dir, cfg)
    late = args.layers - args.split - 1
    meta = {"format_version": 1, "split": args.split, "lambdas": [0.0] * late, "kind": "inputs",
            "model_name": f"random weights, {args.family} shape (speed runs only)"}
    save_file({"weights": torch.eye(d).expand(late, d, d).contiguous(), "biases": torch.zeros(late, d)},
              str(out / f"maps-S{args.split}.safetensors"), metadata={"ridgefill": json.dumps(meta)})
    print(f"wrote {model_dir} and {out / f'maps-S{args.split}.safetensors'}")


def save_random_weights(model_dir: Path, cfg: dict) -> None:
    """Random bfloat16 weights of ``cfg``'s architecture (``transformers``' own initialization, seed 0), saved
    with its ``config.json`` into ``model_dir``."""
    import transformers

    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **fields)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(model_dir)
    print(f"saved {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M random bfloat16 parameters")


def qwen3_next_config(args) -> dict:
    """A Qwen3-Next-80B-A3B-shaped config with 32 experts, or the sizes given on the command line (module
    docstring)."""
    layers, every = args.layers, args.full_every
    return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": args.hidden,
            "num_hidden_layers": layers, "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
            "head_dim": args.head_dim,
            "layer_types": ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)],
            "full_attention_interval": every, "linear_num_key_heads": args.linear_key_heads,
            "linear_num_value_heads": args.linear_value_heads,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "num_experts": args.experts, "num_experts_per_tok": args.experts_per_tok,
            "moe_intermediate_size": args.moe_intermediate, "shared_expert_intermediate_size": args.moe_intermediate,
            "intermediate_size": args.intermediate, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": args.vocab, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
            "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "attention_bias": False,
            "bos_token_id": min(151643, args.vocab - 2), "eos_token_id": min(151645, args.vocab - 1),
            "torch_dtype": "bfloat16"}


def llama_config(args) -> dict:
    """The Llama-3.1-8B-shaped config (or the sizes given on the command line)."""
    d, hd = args.hidden, args.head_dim or args.hidden // args.heads
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
           "num_hidden_layers": args.layers, "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
           "head_dim": hd, "intermediate_size": args.intermediate, "vocab_size": args.vocab, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False,
           "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
           "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}


if __name__ == "__main__":
    main()
