"""Helpers shared by the evaluation tests: a byte-level tokenizer and tiny models that use it."""

from __future__ import annotations

import torch

from conftest import tiny_llama


class ByteTokenizer:
    """One token per UTF-8 byte (vocabulary 256), with ``decode`` and a minimal chat template."""

    chat_template = "<user>{content}</user><assistant>"
    vocab_size = 256

    def __call__(self, text, add_special_tokens=False, **_):
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids, skip_special_tokens=False):
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return self.chat_template.format(content=messages[0]["content"])


def byte_llama(seed: int = 0, layers: int = 6):
    """A tiny random Llama over the 256-byte vocabulary."""
    return tiny_llama(seed=seed, layers=layers, vocab=256)


def save_byte_model(folder, seed: int):
    """Save :func:`byte_llama` (4,096 positions) with a byte-level BPE tokenizer (no merges: one token per
    byte) to ``folder`` as a Hugging Face model directory, as ``--model DIR`` reads it; returns
    ``(model, tokenizer)``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    model = byte_llama(seed=seed)
    model.config.max_position_embeddings = 4096
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


def damp_late_layers(model, split: int, factor: float):
    """Scale the residual updates (``o_proj`` and ``down_proj``) of layers ``> split`` by ``factor``, in
    place: the late layers then change the residual stream by ``O(factor)``, so the identity fill's
    error on the exact rows is ``O(factor²)`` while no fill's is ``O(factor)``."""
    with torch.no_grad():
        for layer in model.model.layers[split + 1:]:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)
    return model
