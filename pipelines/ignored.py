"""Which keyword arguments of a ``pipe(...)`` call a pipeline would ignore, and why.

A diffusers pipeline accepts a negative prompt and uses it only when it runs classifier-free guidance (CFG):
FluxPipeline only with ``true_cfg_scale > 1``, StableDiffusion3Pipeline only with ``guidance_scale > 1``, and
Flux2Pipeline takes none at all. The commands and the server ask :func:`ignored_call_fields` before they run
a call, so that a setting that would change nothing is refused instead of silently dropped.

The CFG rules below were read from the ``__call__`` code of diffusers 0.42.1 for the pipelines of every
family ``bcg_pipelines`` builds (tests/tools/test_ignored_call_fields.py reads that code again, and runs
the tiny pipelines with two negative prompts to see whether the output changes).
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

from .calls import call_parameters
from .registry import FamilySpec, get_family

__all__ = ["CFG_RULES", "CfgRule", "IgnoredField", "ignored_call_fields"]


class CfgRule(NamedTuple):
    """A pipeline runs CFG, and so uses its ``negative_*`` arguments, only when ``call[setting] > above``."""

    setting: str
    above: float


#: The CFG condition of each pipeline class, as its diffusers 0.42.1 ``__call__`` computes it
#: (``do_true_cfg = true_cfg_scale > 1 and has_neg_prompt``; ``do_classifier_free_guidance`` is
#: ``guidance_scale > 1``, or ``> 0`` for Z-Image). Pipelines not listed: only the signature is checked.
CFG_RULES: dict[str, CfgRule] = {
    "FluxPipeline": CfgRule("true_cfg_scale", 1.0),
    "QwenImagePipeline": CfgRule("true_cfg_scale", 1.0),
    "HunyuanVideoPipeline": CfgRule("true_cfg_scale", 1.0),
    "StableDiffusion3Pipeline": CfgRule("guidance_scale", 1.0),
    "PixArtSigmaPipeline": CfgRule("guidance_scale", 1.0),
    "SanaPipeline": CfgRule("guidance_scale", 1.0),
    "WanPipeline": CfgRule("guidance_scale", 1.0),
    "LTXPipeline": CfgRule("guidance_scale", 1.0),
    "CogVideoXPipeline": CfgRule("guidance_scale", 1.0),
    "Lumina2Pipeline": CfgRule("guidance_scale", 1.0),
    "ChromaPipeline": CfgRule("guidance_scale", 1.0),
    "ZImagePipeline": CfgRule("guidance_scale", 0.0),
}


class IgnoredField(NamedTuple):
    """Why a call's keyword would have no effect.

    ``reason`` is one sentence in the call's own terms (keyword names, the pipeline class). ``setting`` names the
    keyword that would make the pipeline use it: with ``above``, when ``call[setting] > above``; with ``above``
    ``None``, when ``setting`` is given at all. Both are ``None`` where nothing would (the pipeline does not take
    the keyword).
    """

    reason: str
    setting: str | None = None
    above: float | None = None


def ignored_call_fields(pipe_or_family: Any, call: dict[str, Any]) -> dict[str, IgnoredField]:
    """The keywords of ``call`` that ``pipe_or_family``'s pipeline would accept and ignore, each with why.

    ``pipe_or_family`` is a pipeline (instance or class, accelerated or not), a family name or a
    :class:`FamilySpec`. ``call`` is the keyword arguments of ``pipe(**call)``; a keyword it leaves out has the
    ``__call__`` default; a keyword set to ``None`` counts as not set. Reported (an empty dict: nothing is
    ignored):

    - ``negative_*`` arguments (``negative_prompt``, ``negative_prompt_2``, ``negative_prompt_embeds``, ...) that
      are not ``None``, where the pipeline would not run classifier-free guidance with this call (:data:`CFG_RULES`:
      e.g. FluxPipeline with ``true_cfg_scale <= 1``, StableDiffusion3Pipeline with ``guidance_scale <= 1``);
    - ``true_cfg_scale > 1`` without any negative argument (such pipelines run true CFG only with one);
    - any keyword (not ``None``) the pipeline's ``__call__`` does not take (e.g. ``negative_prompt`` on Flux2Pipeline), unless it
      takes ``**kwargs``.

    Raises ``ValueError`` for an unknown family name. Nothing is built or imported beyond the pipeline class.
    """
    cls = _pipeline_class(pipe_or_family)
    params = call_parameters(cls)
    name = _rule_owner(cls)
    ignored: dict[str, IgnoredField] = {}
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    if not takes_any:
        for key, value in call.items():
            if key not in params and value is not None:
                ignored[key] = IgnoredField(f"{name}.__call__ takes no {key}, so the pipeline would run without it")
    negatives = [k for k, v in call.items() if k.startswith("negative_") and v is not None and k not in ignored]
    rule = CFG_RULES.get(name)
    if rule is None:
        return ignored
    value = call.get(rule.setting, _default(params, rule.setting))
    runs_cfg = value is not None and value > rule.above
    if not runs_cfg:
        for key in negatives:
            ignored[key] = IgnoredField(
                f"{name} uses {key} only with classifier-free guidance, which it runs with {rule.setting} > "
                f"{rule.above:g}; this call's {rule.setting} is {value}", rule.setting, rule.above)
    elif rule.setting == "true_cfg_scale" and not negatives and "true_cfg_scale" in call:
        ignored["true_cfg_scale"] = IgnoredField(
            f"{name} runs true classifier-free guidance only with a negative prompt; this call has none, so "
            f"true_cfg_scale {value} changes nothing", "negative_prompt", None)
    return ignored


def _pipeline_class(obj: Any) -> type:
    if isinstance(obj, (str, FamilySpec)):
        return get_family(obj).pipeline_class
    return obj if isinstance(obj, type) else type(obj)


def _rule_owner(cls: type) -> str:
    """The name of the first class of ``cls``'s hierarchy with a known rule (an accelerated pipeline is a
    subclass of the diffusers class), else ``cls``'s own name."""
    return next((c.__name__ for c in cls.__mro__ if c.__name__ in CFG_RULES), cls.__name__)


def _default(params: dict[str, inspect.Parameter], name: str) -> Any:
    param = params.get(name)
    return None if param is None or param.default is inspect.Parameter.empty else param.default
