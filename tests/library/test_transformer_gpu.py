"""GPU tests of accelerate_transformer on bare tiny transformers (no pipeline needed)."""

import pytest
import torch

import diffusers

import bcg_diffusion as bcg

from _replay import assert_replayed

pytestmark = pytest.mark.gpu


def _flux():
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    ).to("cuda").eval()
    seq, txt = 64, 12

    def inputs(seed):
        g = torch.Generator("cuda").manual_seed(seed)
        return dict(
            hidden_states=torch.randn(1, seq, 16, device="cuda", generator=g),
            encoder_hidden_states=torch.randn(1, txt, 32, device="cuda", generator=g),
            pooled_projections=torch.randn(1, 32, device="cuda", generator=g),
            timestep=torch.rand(1, device="cuda", generator=g),
            guidance=torch.full((1,), 3.5, device="cuda"),
            img_ids=torch.zeros(seq, 3, device="cuda"),
            txt_ids=torch.zeros(txt, 3, device="cuda"),
            return_dict=False,
        )

    return model, inputs


def _pixart():
    torch.manual_seed(0)
    model = diffusers.PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
        cross_attention_dim=32, caption_channels=24, sample_size=8, patch_size=2, norm_type="ada_norm_single",
        use_additional_conditions=False,
    ).to("cuda").eval()

    def inputs(seed):
        g = torch.Generator("cuda").manual_seed(seed)
        return dict(
            hidden_states=torch.randn(2, 4, 8, 8, device="cuda", generator=g),
            encoder_hidden_states=torch.randn(2, 10, 24, device="cuda", generator=g),
            encoder_attention_mask=torch.ones(2, 10, device="cuda"),
            timestep=torch.full((2,), 500.0, device="cuda"),
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )

    return model, inputs


@pytest.mark.parametrize("make", [_flux, _pixart], ids=["flux-dispatch", "pixart-sdpa"])
def test_bare_transformer_replays_bitwise(make):
    model, inputs = make()
    with torch.no_grad():
        eager = [model(**inputs(s))[0].clone() for s in range(3)]
        bcg.accelerate_transformer(model, bcg.BCGConfig(attention="break"))
        outs = [model(**inputs(s))[0] for s in range(3)]  # other inputs on every call
        model(**inputs(7))  # a later replay must not overwrite the results of the earlier ones
    # the key's first call runs eagerly (warm-up), the second is captured and replayed, the rest replay
    assert_replayed(model, 4)
    stats = bcg.get_stats(model)
    bcg.remove_acceleration(model)
    for i, (o, e) in enumerate(zip(outs, eager)):
        assert torch.equal(o, e), f"call {i} (0: eager warm-up, 1: captured, 2: replayed)"
    assert stats.captures == 1 and stats.hits == 3 and stats.misses == 1 and stats.warmup_calls == 1, str(stats)
    entry = stats.entries[0]
    assert entry.breaks >= 2 and entry.segments == entry.breaks + 1, str(stats)
