"""Weight streaming: a transformer's repeated blocks live in host memory and are copied, one block ahead,
into a few device slots at fixed addresses, so that captured graphs replay them.

- :mod:`.blocks`: which modules are the repeated blocks, in the order they are registered;
- :mod:`.layout`: what of a block is packed where (its tensors' offsets in one buffer);
- :mod:`.buffers`: the packed host copies (page-locked) and the device slots;
- :mod:`.residency`: which block each slot holds and what to load next (host logic only);
- :mod:`.copies`: the copies themselves: a CUDA copy stream and events, or plain CPU copies;
- :mod:`.pointing`: the blocks' tensors pointed at their host copy or their slot;
- :mod:`.block_entry`: each block's entry, at the bottom of its forward chain;
- :mod:`.weight_changes`: writes made between calls (LoRA, ``load_state_dict``) found and taken in;
- :mod:`.checks`: refusals before anything moves;
- :mod:`.streaming`: :class:`~.streaming.WeightStreaming`, which puts it all on a transformer and takes it off.
"""

from .streaming import WeightStreaming, start_streaming, streaming_of

__all__ = ["WeightStreaming", "start_streaming", "streaming_of"]
