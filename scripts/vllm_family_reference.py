"""Reference values for the vLLM plugin's family tests (``tests_vllm/test_families.py``), from ``ridgefill``.

Runs in the project's main environment (``transformers`` 5.24), not in the vLLM one. For each dense family
(``qwen2``, ``qwen3``, ``qwen3_moe``, ``mistral``, ``phi3``, ``gemma3_text``) it

1. builds a tiny random model from a ``transformers`` config (float32; 4 layers, hidden 128, 4 heads of 32
   (vLLM's CPU attention needs a head size of at least 32), 2 KV heads, vocabulary 512; random norm weights and biases, weights drawn at std 0.1 and the LM head scaled by 8 so that the
   logits are not near-uniform; Gemma 3 with sliding-window layers 0 and 2, window 48, and ``gemma3_groups`` with
   sliding-window layers 0, 2 and 3, whose late layers are in two KV-cache groups under vLLM's hybrid KV-cache
   manager) and saves it with the bundled
   model's tokenizer files (vLLM loads a tokenizer; the prompts are token ids below 256),
2. fits context maps at split ``--split`` (``ridgefill.calibration.calibrate``, one token per byte of the
   calibration novels, 2,048 tokens),
3. for two evaluation-text prompts of ``--lengths`` tokens (one token per byte) runs ``ridgefill.prefill``
   (mode ``ridge``, the last ``--tail`` rows exact, no row selection) and ``generate_after`` (greedy), for the
   families of ``--select`` also with the default row selection (``select="on"``), for those of ``--sum-heads``
   with ``select="heads=sum"``, and the exact model on the same prompts and on a short prompt of ``--tail``
   tokens,

and writes a JSON file: per family the model folder, maps file, vLLM architecture, serving dtype, and per prompt
the token ids, the top-``k`` log-probabilities of the first generated token (float64 log-softmax), the greedy
tokens, for the fill, the fill with selection (with its chosen rows) and the exact model, and the smallest gap between the two best logits along the greedy
continuation (``margin``: greedy equality is meaningful when it is well above the tolerance).

The hybrid family (``--families qwen3_next,qwen3_next_oracle``, ``tests_vllm/test_hybrid.py``): checkpoints saved
in bfloat16 (vLLM's CPU linear-attention kernel runs bfloat16 only), the reference in float32 on the same weights;
linear-attention heads of 128 (a size vLLM's CPU kernel knows), slow state decay, 4 experts; the fill also records
the log-probabilities of the first decoding step (``decode``: it reads the recurrent states after the prompt).
``qwen3_next_oracle`` (layers linear/full/full/linear, layer 2 the identity) gets identity maps, under which its fill
is the exact model, and shifted maps (``maps_shifted``, ``x̂_l(t) = h_S(t-1)``) with their reference fill
(``shifted``).

Usage: ``python scripts/vllm_family_reference.py --out families.json --dir DIR [--families qwen2,gemma3_text]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from ridgefill import generate_after, prefill
from ridgefill.calibration import calibrate
from ridgefill.data.models import fetch_default_model
from ridgefill.data.texts import CALIBRATION_BOOKS, EVALUATION_BOOKS, load_texts
from ridgefill.fileio import atomic_write

VOCAB, HIDDEN, LAYERS = 512, 128, 4
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False,
              pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=0.1)
#: a selection whose attention part scores with every head of every late layer (the default keeps the 8 heads
#: of highest induction score, which in the tiny Gemma 3 are all in its full layers)
SUM_SPEC = "heads=sum"
#: the LM head is scaled by this so that the logits are not near-uniform (greedy steps have clear winners)
LOGIT_SCALE = 8.0


def _configs():
    import transformers as tf

    return {
        "qwen2": ("Qwen2ForCausalLM", lambda: tf.Qwen2Config(**COMMON)),
        "qwen3": ("Qwen3ForCausalLM", lambda: tf.Qwen3Config(**COMMON, head_dim=32)),
        "qwen3_moe": ("Qwen3MoeForCausalLM", lambda: tf.Qwen3MoeConfig(**COMMON, head_dim=32, num_experts=4,
                                                                       num_experts_per_tok=2,
                                                                       moe_intermediate_size=64)),
        "mistral": ("MistralForCausalLM", lambda: tf.MistralConfig(**COMMON, sliding_window=None)),
        "phi3": ("Phi3ForCausalLM", lambda: tf.Phi3Config(**COMMON)),
        "gemma3_text": ("Gemma3ForCausalLM", lambda: tf.Gemma3TextConfig(
            **COMMON, head_dim=32, sliding_window=48, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
        # three sliding layers to one full: vLLM's hybrid KV-cache manager gives each sliding layer a KV-cache group
        # of its own (same spec, own block table), so the late layers 2 and 3 write through two groups' slots
        "gemma3_groups": ("Gemma3ForCausalLM", lambda: tf.Gemma3TextConfig(
            **COMMON, head_dim=32, sliding_window=48, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"])),
        "qwen3_next": ("Qwen3NextForCausalLM", lambda: tf.Qwen3NextConfig(
            **COMMON, head_dim=32, layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=1,
            linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)),
        "qwen3_next_oracle": ("Qwen3NextForCausalLM", lambda: tf.Qwen3NextConfig(
            **COMMON, head_dim=32, layer_types=["linear_attention", "full_attention", "full_attention",
                                                "linear_attention"], linear_num_key_heads=1,
            linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)),
    }


#: families served in bfloat16 (vLLM's CPU linear-attention kernel needs it): their checkpoint is saved in
#: bfloat16 and the reference runs in float32 on those same (bfloat16-valued) weights
BF16 = {"qwen3_next", "qwen3_next_oracle"}
#: models whose late layers but the last are the identity (attention output and MLP weights zero), so that identity
#: maps (x̂_l = h_S) predict every late layer's input exactly and the fill equals the exact model: the plugin's fill
#: can then be compared with vLLM's own class in bfloat16. With S = 1 the late layers are 2 (full attention, the
#: identity) and 3 (linear attention, whose states the filled rows advance from their exact inputs).
ORACLE = {"qwen3_next_oracle"}
#: bfloat16 models: weights drawn at std 0.05 and the LM head scaled by 4 (bfloat16 rounding moves log-probabilities
#: in proportion to the logits' size)
BF16_INIT, BF16_LOGIT_SCALE = 0.05, 4.0


class ByteTokenizer:
    """One token per byte (ids 0-255), for calibration and prompts of the tiny models."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode())}


def build(name: str, arch: str, make_config):
    """The tiny random model of family ``name`` (float32, eval mode)."""
    import transformers as tf

    torch.manual_seed(0)
    config = make_config()
    if name in BF16:
        config.initializer_range = BF16_INIT
    model = getattr(tf, arch)(config).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if name in BF16:  # hybrid: (1 + w) norms and the gated norm's w, both around their initial values
                if "norm" in pname:
                    p.add_(0.1 * torch.randn_like(p))
                elif pname.endswith("A_log"):  # slow decay: the recurrent state remembers the filled rows
                    p.copy_(torch.empty_like(p).uniform_(0.01, 0.1).log())
                elif pname.endswith(".bias"):
                    p.normal_(0.0, 0.5)
            elif "norm" in pname:
                p.copy_((1 + 0.3 * torch.randn_like(p)) if not name.startswith("gemma3") else 0.3 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.normal_(0.0, 0.5)
        model.lm_head.weight.mul_(LOGIT_SCALE if name not in BF16 else BF16_LOGIT_SCALE)
        if name in ORACLE:
            for layer in model.model.layers[2:-1]:
                for pname, p in layer.named_parameters():
                    if pname.endswith(("o_proj.weight", "down_proj", "down_proj.weight", "out_proj.weight")):
                        p.zero_()
    if name in BF16:
        model = model.to(torch.bfloat16).to(torch.float32)  # the served weights, exactly
    return model


def _top(logits: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    logp = torch.log_softmax(logits.double(), -1)
    top = logp.topk(k)
    return top.indices.tolist(), top.values.tolist()


@torch.inference_mode()
def _margin(model, ids: torch.Tensor, new: torch.Tensor) -> float:
    """Smallest top-1/top-2 logit gap of the exact model along ``ids`` + ``new`` (the greedy steps)."""
    seq = torch.cat([ids, new], -1)
    logits = model(seq).logits[0, ids.shape[1] - 1:-1]
    top2 = logits.topk(2, -1).values
    return float((top2[:, 0] - top2[:, 1]).min())


@torch.inference_mode()
def _decode_step(model, ids: torch.Tensor, maps, tail: int, first: torch.Tensor, k: int) -> dict:
    """Top-``k`` log-probabilities of the second generated token: one decoding step on ``first`` from the cache
    of ``ridgefill.prefill`` (mode ridge), which holds the recurrent layers' states after the prompt."""
    res = prefill(model, ids, maps, tail=tail, select="off", mode="ridge")
    logits = model(input_ids=first[None], cache=res.cache, use_cache=True).logits[0, -1]
    return dict(zip(("top_ids", "top_logprobs"), _top(logits, k)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--dir", required=True, help="folder for the model folders and maps")
    ap.add_argument("--families", default="qwen2,qwen3,qwen3_moe,mistral,phi3,gemma3_text")
    ap.add_argument("--select", default="qwen2,qwen3,qwen3_moe,mistral,phi3,gemma3_text",
                    help="families whose filled prompts also run with the default row selection (select='on')")
    ap.add_argument("--sum-heads", default="gemma3_text",
                    help=f"families whose filled prompts also run with select={SUM_SPEC!r} (every head scores)")
    ap.add_argument("--split", type=int, default=1)
    ap.add_argument("--tail", type=int, default=32)
    ap.add_argument("--lengths", default="300,200", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    configs = _configs()
    unknown = set(args.families.split(",")) - set(configs)
    if unknown:
        raise SystemExit(f"unknown families {sorted(unknown)}; known: {sorted(configs)}")
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    tok_dir = fetch_default_model()
    texts = load_texts()
    calib = {k: texts[k][:20_000] for k in CALIBRATION_BOOKS[:2]}
    text = texts[EVALUATION_BOOKS[0]]
    lengths = [int(x) for x in args.lengths.split(",")]
    select = set(args.select.split(",")) if args.select else set()
    sum_heads = set(args.sum_heads.split(",")) if args.sum_heads else set()
    out = {"split": args.split, "tail": args.tail, "families": {}}
    for name in args.families.split(","):
        arch, make = configs[name]
        model = build(name, arch, make)
        folder = root / name
        (model.to(torch.bfloat16) if name in BF16 else model).save_pretrained(folder)
        model.to(torch.float32)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, folder / f)
        maps = calibrate(model, ByteTokenizer(), calib, split=args.split, tokens=2048, chunk=128, progress=False,
                         model_name=f"tiny-{name}", context=1)
        maps_path = root / f"{name}-maps.safetensors"
        shifted = None
        if name in ORACLE:  # identity maps (x̂_l = h_S(t)); shifted maps (x̂_l = h_S(t-1)), a wrong fill
            d = model.config.hidden_size
            eye = torch.zeros_like(maps.weights)
            eye[:, :d] = torch.eye(d)
            shifted = dataclasses.replace(maps, weights=torch.roll(eye, d, dims=1), biases=torch.zeros_like(maps.biases))
            maps = dataclasses.replace(maps, weights=eye, biases=torch.zeros_like(maps.biases))
            shifted.save(root / f"{name}-shifted.safetensors")
        maps.save(maps_path)
        start, prompts = 10_000, []
        for n in lengths + [args.tail]:
            ids = torch.tensor([list(text[start:start + 4 * n].encode())[:n]])
            start += 4 * n + 1000
            entry = {"ids": ids[0].tolist()}
            exact = prefill(model, ids, None, mode="exact", select="off", tail=n, split=args.split)
            new = generate_after(model, ids, exact, max_new_tokens=args.gen_tokens)
            entry["exact"] = dict(zip(("top_ids", "top_logprobs"), _top(exact.logits[0, -1], args.top)),
                                  greedy=new[0].tolist(), margin=_margin(model, ids, new))
            if n > args.tail:
                res = prefill(model, ids, maps, tail=args.tail, select="off", mode="ridge")
                new = generate_after(model, ids, res, max_new_tokens=args.gen_tokens)
                entry["fill"] = dict(zip(("top_ids", "top_logprobs"), _top(res.logits[0, -1], args.top)),
                                     greedy=new[0].tolist(), margin=_margin(model, ids, new))
                if name in BF16:  # the first decoding step, reading the states the fill left (recurrent layers)
                    entry["fill"]["decode"] = _decode_step(model, ids, maps, args.tail, new[0, :1], args.top)
                if shifted is not None:
                    res = prefill(model, ids, shifted, tail=args.tail, select="off", mode="ridge")
                    entry["shifted"] = dict(zip(("top_ids", "top_logprobs"), _top(res.logits[0, -1], args.top)))
            for key, spec, families in (("select", "on", select), ("select_sum", SUM_SPEC, sum_heads)):
                if n > args.tail and name in families:
                    res = prefill(model, ids, maps, tail=args.tail, select=spec, mode="ridge")
                    new = generate_after(model, ids, res, max_new_tokens=args.gen_tokens)
                    entry[key] = dict(zip(("top_ids", "top_logprobs"), _top(res.logits[0, -1], args.top)),
                                      greedy=new[0].tolist(), margin=_margin(model, ids, new),
                                      selected=res.selected.tolist())
            prompts.append(entry)
        out["families"][name] = {"model_dir": str(folder.resolve()), "maps": str(maps_path.resolve()),
                                 "architecture": arch, "prompts": prompts,
                                 "dtype": "bfloat16" if name in BF16 else "float32"}
        if shifted is not None:
            out["families"][name]["maps_shifted"] = str((root / f"{name}-shifted.safetensors").resolve())
        print(f"{name}: margins " + ", ".join(f"{p['exact']['margin']:.3f}" for p in prompts), flush=True)
    text_out = json.dumps(out)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(text_out))
    print(f"wrote {args.out}: {len(out['families'])} families")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
