"""The classes of :func:`~bcg_pipelines.pipeline_zoo.transformer_pipelines` that have no case, each with the reason."""

from __future__ import annotations

__all__ = ["NOT_BUILT"]

NOT_BUILT: dict[str, str] = {
    "ConsisIDPipeline": "diffusers exports only a placeholder without opencv-python (cv2), which neither this "
    "environment nor the GPU machine has: the class cannot be imported",
    "OmniGenPipeline": "its constructor builds an OmniGenMultiModalProcessor, which diffusers defines only when "
    "torchvision is installed (NameError without it); neither this environment nor the GPU machine is known to have "
    "torchvision",
    "EasyAnimateControlPipeline": "diffusers 0.42.1 bug: its __call__ passes text_encoder_index=0 to its own "
    "encode_prompt, which takes no such argument, so every call raises TypeError before the first step (eagerly too)",
}
