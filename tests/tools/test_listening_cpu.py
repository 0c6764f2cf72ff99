"""The kit's listener (``bcg_diffusion.toolkit.listening``), which the zoo probe and the planting harness read what
the library says through: runner events, warnings and logged problems, not INFO log lines."""

import logging

import torch

import bcg_diffusion as bcg
import _sabotage
import _shape_break
from bcg_diffusion.toolkit.listening import listening


class NoTensorInput(torch.nn.Module):
    def forward(self, n):
        return torch.ones(n)


def test_the_listener_hears_eager_reasons_stopped_replays_warnings_and_problems():
    model, _ = _shape_break.models("cpu")
    plain = NoTensorInput()
    with _sabotage.suspended():
        bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True))
        bcg.accelerate_transformer(plain, bcg.BCGConfig(debug=True, allow_unknown=True))
        x = torch.randn(2, 4)
        with listening() as heard, torch.no_grad():
            model(x), model(x), plain(2), plain(2)
            _shape_break.WIDTH["n"] = 8
            try:
                model(x)
            finally:
                _shape_break.WIDTH["n"] = 4
            logging.getLogger("bcg_diffusion").info("bcg: an INFO line the listener does not read")
            logging.getLogger("bcg_diffusion").warning("bcg: a problem")
        plain(2)  # after the block: not heard
    assert heard.eager_reasons == ["no input tensor is on a CPU device"]
    assert [o for o in heard.outcomes if o.startswith("replay stopped")], heard.outcomes
    assert len(heard.capture_warnings) == 1 and "replay of WideningModel stopped" in heard.capture_warnings[0]
    assert heard.problems == ["bcg: a problem"]
    assert not any("INFO line" in line for line in heard.said())
    bcg.remove_acceleration(model)
    bcg.remove_acceleration(plain)
