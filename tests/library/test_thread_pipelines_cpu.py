"""bcg_diffusion.pipeline_for_thread on the CPU: what the second pipeline shares with the first (the torch modules)
and what it gets its own copy of (scheduler, tokenizers), for every family; dtypes never cast (a float32 VAE beside
a bfloat16 transformer stays so, which from_pipe does not keep), component overrides, bad input."""

from __future__ import annotations

import pytest
import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from _pipes import build


@pytest.fixture(scope="module")
def flux_pipe():
    return build("flux", dtype=torch.bfloat16, device="cpu")  # progress bars off, as every built pipeline


def test_the_models_are_shared_and_everything_else_is_copied(flux_pipe):
    other = bcg_diffusion.pipeline_for_thread(flux_pipe)
    assert type(other) is type(flux_pipe)
    for name, value in flux_pipe.components.items():
        if isinstance(value, torch.nn.Module):
            assert other.components[name] is value, name
        elif value is not None:
            assert other.components[name] is not value and type(other.components[name]) is type(value), name
    assert {"scheduler", "tokenizer", "tokenizer_2"} <= {
        n for n, v in flux_pipe.components.items() if v is not None and not isinstance(v, torch.nn.Module)}


@pytest.mark.parametrize("family", list(pipelines.list_families()))
def test_every_family_gets_its_own_tokenizers_and_scheduler(family):
    pipe = pipelines.build_pipeline(family, size="tiny", device="cpu", seed=0)
    other = bcg_diffusion.pipeline_for_thread(pipe)
    assert set(other.components) == set(pipe.components)
    own = {n for n, v in pipe.components.items() if v is not None and other.components[n] is not v}
    assert "scheduler" in own and any(n.startswith("tokenizer") for n in own), own
    assert all(not isinstance(pipe.components[n], torch.nn.Module) for n in own), own
    assert {k: v for k, v in other.config.items() if k not in pipe.components} == {
        k: v for k, v in pipe.config.items() if k not in pipe.components}


def test_no_module_is_cast(flux_pipe):
    flux_pipe.vae.to(torch.float32)  # kept in float32 beside the bfloat16 transformer, as some users do
    try:
        other = bcg_diffusion.pipeline_for_thread(flux_pipe)
        assert other.vae is flux_pipe.vae and flux_pipe.vae.dtype == torch.float32
        assert flux_pipe.transformer.dtype == flux_pipe.text_encoder.dtype == torch.bfloat16
        type(flux_pipe).from_pipe(flux_pipe, torch_dtype=flux_pipe.dtype)
        assert flux_pipe.vae.dtype == torch.bfloat16  # what from_pipe does to the modules the two share
    finally:
        flux_pipe.vae.to(torch.bfloat16)


def test_the_dtype_and_the_progress_bar_settings_are_kept(flux_pipe):
    other = bcg_diffusion.pipeline_for_thread(flux_pipe)
    assert other.dtype == flux_pipe.dtype == torch.bfloat16
    assert flux_pipe.transformer.dtype == flux_pipe.text_encoder.dtype == torch.bfloat16  # from_pipe did not cast them
    assert other._progress_bar_config == {"disable": True}


def test_the_copies_encode_as_the_originals(flux_pipe):
    other = bcg_diffusion.pipeline_for_thread(flux_pipe)
    for name in ("tokenizer", "tokenizer_2"):
        mine, theirs = getattr(flux_pipe, name), getattr(other, name)
        kwargs = dict(padding="max_length", max_length=77, truncation=True, return_tensors="pt")
        assert torch.equal(mine("a red fox", **kwargs).input_ids, theirs("a red fox", **kwargs).input_ids)


def test_a_component_given_replaces_the_copy(flux_pipe):
    scheduler = type(flux_pipe.scheduler).from_config(flux_pipe.scheduler.config, shift=2.0)
    other = bcg_diffusion.pipeline_for_thread(flux_pipe, scheduler=scheduler)
    assert other.scheduler is scheduler and other.tokenizer is not flux_pipe.tokenizer


def test_something_else_than_a_pipeline_is_refused(flux_pipe):
    with pytest.raises(TypeError, match="takes a diffusers pipeline .* got Linear"):
        bcg_diffusion.pipeline_for_thread(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="FluxPipeline has no component tokeniser; its components: .*tokenizer"):
        bcg_diffusion.pipeline_for_thread(flux_pipe, tokeniser=None)


def test_a_pipeline_that_offloads_is_refused(flux_pipe, monkeypatch):
    monkeypatch.setattr(flux_pipe, "_all_hooks", [object()], raising=False)
    with pytest.raises(ValueError, match="model CPU offload enabled.*pipe.remove_all_hooks"):
        bcg_diffusion.pipeline_for_thread(flux_pipe)
