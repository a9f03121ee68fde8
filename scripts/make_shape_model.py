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

Usage: ``python scripts/make_shape_model.py OUT_DIR [--family llama|qwen3_next] [--split 15] [--layers 32 ...]``
(writes ``OUT_DIR/model/config.json`` and ``OUT_DIR/maps-S<split>.safetensors``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--split", type=int, default=None, help="S (default 15; 23 for --family qwen3_next)")
    ap.add_argument("--family", choices=("llama", "qwen3_next"), default="llama")
    args = ap.parse_args()
    out = Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    if args.family == "qwen3_next":
        args.layers, args.hidden, args.vocab = 48, 2048, 151936
        args.split = 23 if args.split is None else args.split
        cfg = qwen3_next_config()
    else:
        args.split = 15 if args.split is None else args.split
        cfg = llama_config(args)
    d = args.hidden
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    late = args.layers - args.split - 1
    meta = {"format_version": 1, "split": args.split, "lambdas": [0.0] * late, "kind": "inputs",
            "model_name": f"random weights, {args.family} shape (speed runs only)"}
    save_file({"weights": torch.eye(d).expand(late, d, d).contiguous(), "biases": torch.zeros(late, d)},
              str(out / f"maps-S{args.split}.safetensors"), metadata={"ridgefill": json.dumps(meta)})
    print(f"wrote {model_dir} and {out / f'maps-S{args.split}.safetensors'}")


def qwen3_next_config() -> dict:
    """A Qwen3-Next-80B-A3B-shaped config with 32 experts (module docstring)."""
    layers = 48
    return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
            "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
            "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "num_experts": 32, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "intermediate_size": 5120, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": 151936, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
            "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "attention_bias": False,
            "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"}


def llama_config(args) -> dict:
    """The Llama-3.1-8B-shaped config (or the sizes given on the command line)."""
    d, hd = args.hidden, args.hidden // args.heads
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
           "num_hidden_layers": args.layers, "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
           "head_dim": hd, "intermediate_size": args.intermediate, "vocab_size": args.vocab, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False,
           "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
           "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}


if __name__ == "__main__":
    main()
