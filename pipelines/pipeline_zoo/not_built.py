"""The classes of :func:`~bcg_pipelines.pipeline_zoo.transformer_pipelines` that have no case, each with the reason."""

from __future__ import annotations

__all__ = ["NOT_BUILT"]

NOT_BUILT: dict[str, str] = {
    "ConsisIDPipeline": "diffusers exports only a placeholder without opencv-python (cv2), which neither this "
    "environment nor the GPU machine has: the class cannot be imported",
}
