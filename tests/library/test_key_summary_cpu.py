"""A graph key's description (``GraphKey.summary``, what ``get_stats`` and the server's ``/stats`` show per entry):
keys that differ only in their LoRA adapters' state read differently (they used to read the same, so a LoRA
server's base and adapter entries, and the soak's list of keys new since the warm-up, could not be told apart)."""

from __future__ import annotations

import torch
from peft import LoraConfig, inject_adapter_in_model

from bcg_diffusion.integration.fingerprint import WeightsFingerprint, describe_adapters
from bcg_diffusion.integration.keys import GraphKey, TensorSpec

INPUTS = (("hidden_states", TensorSpec((1, 4), (4, 1), torch.float32, torch.device("cpu"), False)),)


def lora_model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    config = LoraConfig(r=2, lora_alpha=2, target_modules=["0", "1"])
    inject_adapter_in_model(config, model, adapter_name="style")
    return model


def key_of(model: torch.nn.Module) -> GraphKey:
    return GraphKey(INPUTS, (), WeightsFingerprint(model).current())


def test_without_adapters_the_summary_is_the_tensor_inputs():
    assert key_of(torch.nn.Linear(4, 4)).summary() == "hidden_states=tensor[1, 4] float32 cpu"
    assert GraphKey(INPUTS, (), None).summary() == "hidden_states=tensor[1, 4] float32 cpu"


def test_the_adapters_state_is_in_the_summary():
    model = lora_model()
    active = key_of(model)
    assert active.summary() == "hidden_states=tensor[1, 4] float32 cpu; adapters style (scaling 1)"
    for layer in model.modules():
        if isinstance(getattr(layer, "scaling", None), dict):
            layer.scaling["style"] = 0.5
    scaled = key_of(model)
    assert scaled.summary().endswith("; adapters style (scaling 0.5)") and scaled != active
    for layer in model.modules():
        if isinstance(getattr(layer, "scaling", None), dict):
            layer.enable_adapters(False)
    assert key_of(model).summary().endswith("; adapters disabled")


def test_other_fingerprints_describe_no_adapters():
    assert describe_adapters(None) == describe_adapters((1, 2, 3)) == describe_adapters((1, 2, 3, ())) == ""


def test_a_scaling_held_in_a_tensor_is_named_without_a_value():
    """The server's hot-swap slot keeps each scaling as a 0-dim tensor written in place (one key for every scale):
    the description names the slot, not a value that the key does not hold."""
    layer = ((("slot", torch.tensor(0.5)),), ("slot",), False, ())
    assert describe_adapters((1, 2, 3, (layer,))) == "adapters slot"
