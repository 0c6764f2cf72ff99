"""The classes of :func:`~bcg_pipelines.pipeline_zoo.transformer_pipelines` that have no case, each with the reason.

``NOT_BUILT``: classes that cannot be built or called offline here (a missing backend, a diffusers bug that makes
every call raise). ``NOT_YET_BUILT``: classes that could be built from local components, for which no case has been
written yet; each says what it needs. Both count as not built in the probe's totals.
"""

from __future__ import annotations

__all__ = ["NOT_BUILT", "NOT_YET_BUILT"]

NOT_BUILT: dict[str, str] = {
    "ConsisIDPipeline": "diffusers exports only a placeholder without opencv-python (cv2), which neither this "
    "environment nor the GPU machine has: the class cannot be imported",
    "OmniGenPipeline": "its constructor builds an OmniGenMultiModalProcessor, which diffusers defines only when "
    "torchvision is installed (NameError without it); neither this environment nor the GPU machine is known to have "
    "torchvision",
    "EasyAnimateControlPipeline": "diffusers 0.42.1 bug: its __call__ passes text_encoder_index=0 to its own "
    "encode_prompt, which takes no such argument, so every call raises TypeError before the first step (eagerly too)",
}

NOT_YET_BUILT: dict[str, str] = {
    "AceStepPipeline": "needs a tiny AceStepConditionEncoder (lyrics and timbre encoders) and the audio tokenizer "
    "pair; no case written yet",
    "BriaFibo2Pipeline": "needs the Qwen3-VL processor (done for other cases) and the text-image rendering path "
    "(fonts); no case written yet",
    "Cosmos2_5_TransferPipeline": "needs a tiny CosmosControlNetModel and control videos in its `controls` format; "
    "no case written yet",
    "Cosmos3OmniPipeline": "needs the omni transformer's tokenizer layout (vision tokens at given indexes of a text "
    "sequence) and its sound tokenizer; no case written yet",
    "GlmImagePipeline": "needs a tiny GlmImageForConditionalGeneration that generates the prior image tokens "
    "autoregressively, its GlmImageProcessor and a ByT5 encoder; no case written yet",
    "Kandinsky6SRPipeline": "needs a tiny Kandinsky6SRVAE and video tiles of the super-resolution path; no case "
    "written yet",
    "RFD4ProteinaPipeline": "generates protein structures (backbone coordinates and residue latents), not images, "
    "video or audio; its transformer is excluded from the transformer zoo for that reason; no case written yet",
    "SanaWMPipeline": "needs camera poses, actions and intrinsics in its world-model format; no case written yet",
}
