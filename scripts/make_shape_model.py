"""A Llama model config of a given shape and identity maps for it, for speed runs only.

Time to first token does not depend on the weights' values, so the GPU run (``scripts/gpu_vllm.sh``)
measures the Llama-3.1-8B shape without its weights: ``config.json`` (Llama 3.1 8B: 32 layers,
hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocabulary 128256, RoPE θ 500000 with llama3 scaling,
131072 positions), served by vLLM with ``load_format="dummy"`` (random weights, no checkpoint file),
plus a RidgeFill maps file at split ``S`` with ``W_l = I``, ``b_l = 0`` (the identity fill: the same
work per token as fitted maps). The outputs are meaningless text; never use them for quality.

Usage: ``python scripts/make_shape_model.py OUT_DIR [--split 15] [--layers 32 ...]`` (writes
``OUT_DIR/model/config.json`` and ``OUT_DIR/maps-S<split>.safetensors``).
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
    ap.add_argument("--split", type=int, default=15)
    args = ap.parse_args()
    out = Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    d, hd = args.hidden, args.hidden // args.heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
           "num_hidden_layers": args.layers, "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
           "head_dim": hd, "intermediate_size": args.intermediate, "vocab_size": args.vocab, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False,
           "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
           "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    late = args.layers - args.split - 1
    meta = {"format_version": 1, "split": args.split, "lambdas": [0.0] * late, "kind": "inputs",
            "model_name": "random weights, Llama shape (speed runs only)"}
    save_file({"weights": torch.eye(d).expand(late, d, d).contiguous(), "biases": torch.zeros(late, d)},
              str(out / f"maps-S{args.split}.safetensors"), metadata={"ridgefill": json.dumps(meta)})
    print(f"wrote {model_dir} and {out / f'maps-S{args.split}.safetensors'}")


if __name__ == "__main__":
    main()
