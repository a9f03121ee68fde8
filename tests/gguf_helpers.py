"""A tiny Llama GGUF written with the ``gguf`` package (float32 tensors, llama.cpp layout and names),
for tests of GGUF loading: no download, about 100 KB."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 64
#: unknown, BOS, EOS, the word-boundary piece, then byte tokens for the letters and common punctuation of
#: English prose (so real text tokenises into one token per character, nearly all of it known).
TOKENS = ["<unk>", "<s>", "</s>", "\u2581"] + [f"<0x{b:02X}>" for b in sorted(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,.';-!?\n")]
assert len(TOKENS) == VOCAB
_HF_TO_GGUF = [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
               ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
               ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"),
               ("post_attention_layernorm", "ffn_norm")]


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q/k projections with the rotary halves interleaved; transformers undoes this."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: str | Path, *, layers: int = 2, hidden: int = 32, seed: int = 0,
                    drop: tuple[str, ...] = (), tied: bool = False) -> LlamaForCausalLM:
    """Write a random Llama (4 heads, 2 KV heads, SentencePiece-style vocabulary of 64 (:data:`TOKENS`)) as a
    float32 GGUF at ``path``, leaving out the GGUF tensors named in ``drop``; return the source model.
    ``tied``: the output layer is the token embedding (no ``output.weight`` tensor, as llama.cpp writes
    tied models); else it is a separate random matrix."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tied, rms_norm_eps=1e-6)
    model = LlamaForCausalLM(cfg).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(2 * hidden)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([2, 3, 3, 1] + [6] * (VOCAB - 4))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for i in range(layers):
        for hf, gg in _HF_TO_GGUF:
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for key, value in model.state_dict().items():
        name = names[key]
        if name in drop or (tied and name == "output.weight"):
            continue
        t = value.numpy()
        if name.endswith("attn_q.weight"):
            t = _unpermute(t, 4)
        elif name.endswith("attn_k.weight"):
            t = _unpermute(t, 2)
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


def write_header_only_gguf(path: str | Path, arch: str, name: str = "tiny") -> None:
    """Write a well-formed GGUF of architecture ``arch`` holding one small tensor (for refusals by type)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def metadata_end(path: str | Path) -> tuple[int, int]:
    """``(end of the key/value metadata, start of the tensor data)`` in bytes, from the ``gguf`` reader."""
    reader = gguf.GGUFReader(str(path))
    kv_end = max(int(f.offset) + sum(p.nbytes for p in f.parts) for f in reader.fields.values())
    return kv_end, int(reader.data_offset)
