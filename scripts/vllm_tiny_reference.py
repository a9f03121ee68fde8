"""Reference values for the vLLM plugin's tensor-parallel tests (``tests_vllm/test_tensor_parallel.py``).

Tensor parallelism splits the attention heads across ranks, and the bundled SmolLM2-135M-Instruct has 9
heads (3 K/V heads), which 2 ranks cannot split. So this script, in the project's main environment:

1. builds a tiny random Llama from a ``transformers`` config (6 layers, hidden 128, 4 heads of 32, 2 K/V
   heads, MLP 256, tied embeddings; weights drawn with ``initializer_range`` 0.1 from seed 0) with the
   bundled model's tokenizer (vocabulary 49,152), saved as a Hugging Face folder vLLM loads;
2. fits context maps at split ``--split`` on ``--calib-tokens`` tokens of the calibration novels (with the
   model's induction scores, format version 2), and writes a copy without them (``maps_without_induction``: the
   plugin then scores the heads itself, as for version 1 files);
3. for evaluation-text prompts of the given lengths, runs ``ridgefill.prefill`` (the last ``--tail`` rows
   exact) in mode ``exact``, in mode ``ridge`` without row selection and with the default one
   (``select="on"``, the rows it chose recorded), each with ``generate_after`` (greedy).

It writes a JSON file: ``model_dir``, ``maps``, ``maps_without_induction``, ``split``, ``tail`` and per prompt its token ids and, for
``exact``, ``fill`` and ``select``, the top-``k`` first-token log-probabilities (float64 log-softmax of the
last row's logits) and the greedy continuation (``select`` also the chosen rows).

Usage: ``python scripts/vllm_tiny_reference.py --out ref.json --dir WORK_DIR [--lengths 300,200,120]``
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
from ridgefill.data.models import fetch_default_model, load_model
from ridgefill.data.texts import CALIBRATION_BOOKS, EVALUATION_BOOKS, load_texts
from ridgefill.fileio import atomic_write

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make_model(out: Path) -> Path:
    """Save the tiny random Llama (with the bundled model's tokenizer) to ``out/tiny-llama``; returns it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    bundled = fetch_default_model()
    base = json.loads((bundled / "config.json").read_text())
    cfg = LlamaConfig(vocab_size=base["vocab_size"], hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.1,
                      bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"],
                      pad_token_id=base["pad_token_id"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    folder = out / "tiny-llama"
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copyfile(bundled / name, folder / name)
    return folder


def _top(logits: torch.Tensor, k: int) -> dict:
    top = torch.log_softmax(logits.double(), -1).topk(k)
    return {"top_ids": top.indices.tolist(), "top_logprobs": top.values.tolist()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--dir", required=True, help="folder for the model and the maps")
    ap.add_argument("--split", type=int, default=2)
    ap.add_argument("--calib-tokens", type=int, default=4096)
    ap.add_argument("--tail", type=int, default=32)
    ap.add_argument("--lengths", default="300,200,120", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--top", type=int, default=20, help="log-probabilities kept per prompt")
    args = ap.parse_args(argv)
    out_dir = Path(args.dir)
    folder = make_model(out_dir)
    model, tok, name = load_model(str(folder))
    texts = load_texts()
    maps = calibrate(model, tok, {k: texts[k] for k in CALIBRATION_BOOKS}, split=args.split,
                     tokens=args.calib_tokens, model_name="tiny random Llama (tensor-parallel tests)",
                     progress=False, context=1)
    maps_path = out_dir / f"tiny-maps-S{args.split}.safetensors"
    maps.save(maps_path)
    bare_path = out_dir / f"tiny-maps-S{args.split}-without-induction.safetensors"
    dataclasses.replace(maps, induction=None).save(bare_path)
    ids_all = tok(texts[EVALUATION_BOOKS[0]][:100_000])["input_ids"]
    prompts, start = [], 3000
    for n in (int(x) for x in args.lengths.split(",")):
        ids = torch.tensor([ids_all[start:start + n]])
        start += n + 500
        entry = {"ids": ids[0].tolist()}
        for key, mode, select in (("exact", "exact", "off"), ("fill", "ridge", "off"), ("select", "ridge", "on")):
            res = prefill(model, ids, maps, tail=min(args.tail, n), select=select, mode=mode)
            entry[key] = dict(_top(res.logits[0, -1], args.top),
                              greedy=generate_after(model, ids, res, max_new_tokens=args.gen_tokens)[0].tolist())
            if key == "select":
                entry[key]["selected"] = res.selected.tolist()
        prompts.append(entry)
    out = {"model_dir": str(folder.resolve()), "maps": str(maps_path.resolve()),
           "maps_without_induction": str(bare_path.resolve()), "split": maps.split,
           "tail": args.tail, "prompts": prompts}
    text = json.dumps(out)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
    print(f"wrote {args.out}: {len(prompts)} prompts, model {folder}, maps {maps_path} (S={maps.split})")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
