"""Images in chat: the prompt (with vision tokens) they make.

Images are read by :mod:`pytest_llmperf.sim.image_loading` (data or http(s) URLs, size from the
header, a BLAKE2b content key). The key is also the source of the image's placeholder token id,
so the same image at the same place in a prompt gives the same KV block hashes (a prefix-cache
hit), as vLLM hashes multimodal content into its block hashes.

Each image becomes V = ``PerfModel.image_tokens(width, height)`` placeholder tokens at the place
of its part (see :class:`~pytest_llmperf.sim.presets.VisionSpec` for V). Errors are 400s that
name the part (``messages[0].content[1]: ...``):

- the model has no vision encoder: ``<model> is not a multimodal model`` (vLLM's words);
- the image cannot be read (see :mod:`~pytest_llmperf.sim.image_loading`);
- an image more elongated than the encoder's processor accepts (200:1 for Qwen2-VL's).

With ``SimConfig.ignore_images`` (a fault knob) image parts are dropped before any of that: the
prompt is the text alone, and nothing is fetched or encoded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError
from pytest_llmperf.sim.image_loading import bad_part
from pytest_llmperf.sim.request_parsing import ApiError, bool_field
from pytest_llmperf.sim.scheduler import ImageSlot
from pytest_llmperf.sim.tokenizer import TokenizerError, image_token_id

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.sim.state import SimState


async def chat_prompt(
    state: SimState, data: Mapping[str, object], tools: Sequence[object] | None = None
) -> tuple[list[int], tuple[ImageSlot, ...]]:
    """The chat request's prompt ids, vision tokens (and ``tools``' system message) included, and
    its images' slots."""
    if "messages" not in data:
        raise ApiError(400, "messages: field required", "messages")
    try:
        ids, parts = state.tokenizer.encode_chat_parts(
            data["messages"], bool_field(data, "add_generation_prompt", True), tools)
    except TokenizerError as exc:
        raise ApiError(400, str(exc), "messages") from None
    if not parts or state.config.ignore_images:
        return ids, ()
    perf = state.perf
    if perf.vision is None:
        raise ApiError(400, f"{state.model_name} is not a multimodal model", "messages")
    out: list[int] = []
    slots: list[ImageSlot] = []
    start = 0
    for position, part in parts:
        info = await state.images.load(part.url, part.where)
        try:
            tokens = perf.image_tokens(info.width, info.height)
        except InputError as exc:
            raise bad_part(part.where, str(exc)) from None
        out += ids[start:position]
        slots.append(ImageSlot(len(out), tokens, info.key, perf.image_flops(info.width, info.height)))
        out += [image_token_id(info.key)] * tokens
        start = position
    out += ids[start:]
    return out, tuple(slots)
