"""Shared fixtures: tiny random-weight Llama models built in the test process (no download)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0, layers: int = 6, hidden: int = 64, vocab: int = 101) -> LlamaForCausalLM:
    """A random Llama (GQA: 4 heads, 2 KV heads) with float32 weights, in eval mode."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    return model


@pytest.fixture(scope="session")
def tiny():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 101, (2, 48), generator=g)
