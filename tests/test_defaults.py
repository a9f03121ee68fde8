"""The default split: the split ``ridgefill tune`` chose for the bundled SmolLM2, depth 1/2 for other models."""

from conftest import tiny_llama

from ridgefill import defaults
from ridgefill.data.models import load_model


def test_bundled_smollm2_defaults_to_its_tuned_split():
    model, _, _ = load_model("smollm2")
    assert model.config.ridgefill_bundled == "smollm2"
    assert model.config.num_hidden_layers == 30 and defaults.default_split(model) == 12


def test_other_models_default_to_half_their_layers():
    assert defaults.default_split(tiny_llama(layers=6)) == 3
    assert defaults.default_split(tiny_llama(layers=7)) == 3
    assert defaults.split_for(18, "gemma3") == 9  # Gemma 3 270M: no tuned split
    assert defaults.split_for(32) == 16
