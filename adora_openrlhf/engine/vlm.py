"""Vision-language policies for the local backend: the tiny Qwen2.5-VL, its processor, and image inputs.

The tiny policy is a random-init ``Qwen2_5_VLForConditionalGeneration`` (``model.tiny`` sizes the language
model, ``model.tiny_vision`` the vision tower) with the byte-level BPE tokenizer of the text models extended
by Qwen2.5-VL's vision special tokens (:data:`VISION_TOKENS`), and a ``Qwen2_5_VLProcessor`` around it whose
image processor is ``Qwen2VLImageProcessorPil`` (PIL backend, no torchvision). Model and processor are saved
in the Hugging Face layout, so ``--model PATH`` loads a run's ``final_model/`` like a real Qwen2.5-VL
checkpoint, through the same :func:`load_vlm` / :func:`load_processor`.

Image inputs. The processor turns a prompt text with one ``<|vision_start|><|image_pad|><|vision_end|>``
block per image into token ids (the ``<|image_pad|>`` expanded to ``t*h*w / merge_size^2`` copies) plus
``pixel_values`` ``[patches, 3 * temporal_patch * patch^2]`` and ``image_grid_thw`` ``[images, 3]``. Those two
tensors are the per-prompt *extra model inputs*: rollouts and the policy update concatenate them over the
sequences of a batch (in batch order) and add ``mm_token_type_ids`` = 1 where the token is ``<|image_pad|>``,
which Qwen2.5-VL needs to build its 3-D (M-RoPE) positions. The same keys are what OpenRLHF 0.11.2 keeps
from the processor output (``vlm_utils.process_prompt_with_images``) and rebuilds in ``Actor.forward``.

The processor class for Qwen2.5-VL in transformers 5.15 also builds a video processor, whose class needs
torchvision and a saved video config; without them :func:`load_processor` builds
:func:`image_only_processor_class`, the same processor without the video part (saved files name ``Qwen2_5_VLProcessor``, so a machine with
torchvision loads them with ``AutoProcessor``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adora_openrlhf.config import ConfigError
from adora_openrlhf.engine.model import tiny_lm_settings

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_TAG = "<image>"  # the row schema's image slot in prompt texts (Geometry3K, MathVista, OpenRLHF)
EXTRA_INPUT_KEYS = ("pixel_values", "image_grid_thw")  # per-prompt processor outputs passed to the model

# The tiny processor's chat template: the user turns with one vision block per image item, then a newline
# (the same text as the compact template, so OpenRLHF's --data.apply_chat_template works with the tiny model).
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    + IMAGE_BLOCK
    + "{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '\\n' }}{% endif %}"
)


@functools.cache
def image_only_processor_class():
    """``ImageOnlyQwen2_5_VLProcessor``: ``Qwen2_5_VLProcessor`` with an image processor and a tokenizer only (no
    video processor, which needs torchvision). Text and image processing are Qwen2.5-VL's own. Made on first use:
    importing the processor classes takes seconds, which a text model's evaluation and training never need."""
    from transformers import Qwen2_5_VLProcessor

    class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            Qwen2_5_VLProcessor.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

        def save_pretrained(self, save_directory, *args, **kwargs):
            out = super().save_pretrained(save_directory, *args, **kwargs)
            config = Path(save_directory) / "processor_config.json"
            if config.exists():  # name the public class, so AutoProcessor (with torchvision) loads the files
                data = json.loads(config.read_text())
                data["processor_class"] = "Qwen2_5_VLProcessor"
                config.write_text(json.dumps(data, indent=2) + "\n")
            return out

    ImageOnlyQwen2_5_VLProcessor.__qualname__ = "ImageOnlyQwen2_5_VLProcessor"  # pickled by name: module __getattr__
    return ImageOnlyQwen2_5_VLProcessor


def __getattr__(name: str):
    """``vlm.ImageOnlyQwen2_5_VLProcessor`` (made on first use, see :func:`image_only_processor_class`)."""
    if name == "ImageOnlyQwen2_5_VLProcessor":
        return image_only_processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_tiny_processor(tokenizer, vision_cfg):
    """Processor for the tiny model: ``tokenizer`` (extended in place by :data:`VISION_TOKENS`) and a PIL
    Qwen2-VL image processor that resizes every image to ``vision_cfg.image_size`` pixels a side."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    pixels = vision_cfg.image_size**2
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=vision_cfg.patch_size,
        merge_size=vision_cfg.spatial_merge_size,
        temporal_patch_size=2,
        min_pixels=pixels,
        max_pixels=pixels,
    )
    return image_only_processor_class()(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=TINY_CHAT_TEMPLATE
    )


def build_tiny_vlm(text_cfg, vision_cfg, tokenizer, seed: int):
    """A random-init Qwen2.5-VL: the language model of ``text_cfg`` (``model.tiny``) and the vision tower of
    ``vision_cfg`` (``model.tiny_vision``); initialised from ``seed`` without touching the global RNG."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    head_dim = text_cfg.hidden_size // text_cfg.num_attention_heads
    half = head_dim // 2  # M-RoPE splits the rotary half-dimension into (temporal, height, width) sections
    section = [half - 2 * (half // 3), half // 3, half // 3]
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **tiny_lm_settings(text_cfg, tokenizer),
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
        ),
        vision_config=dict(
            depth=vision_cfg.depth,
            hidden_size=vision_cfg.hidden_size,
            intermediate_size=vision_cfg.intermediate_size,
            num_heads=vision_cfg.num_heads,
            patch_size=vision_cfg.patch_size,
            spatial_merge_size=vision_cfg.spatial_merge_size,
            temporal_patch_size=2,
            window_size=vision_cfg.image_size,  # one attention window per image (few, cheap attention calls)
            fullatt_block_indexes=[vision_cfg.depth - 1],
            out_hidden_size=text_cfg.hidden_size,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2_5_VLForConditionalGeneration(config)


def freeze_visual_encoder(model) -> int:
    """Stop gradients to every parameter outside the language model (``language_model.*``) and the output head
    (``lm_head.*``): the vision encoder and its projector (merger), OpenRLHF's ``--actor.freeze_visual_encoder``
    rule (LoRA adapters inside them included). Returns how many parameters it froze; a model with no such
    parameters (no ``language_model`` in any name) is an error rather than a silently frozen language model."""
    names = [name for name, _ in model.named_parameters()]
    if not any("language_model" in name for name in names):
        raise ConfigError(
            "model.freeze_visual_encoder: the model has no language_model.* parameters to keep training "
            f"({type(model).__name__}); use a vision-language checkpoint such as Qwen2.5-VL or drop the option"
        )
    frozen = 0
    for name, param in model.named_parameters():
        if "language_model" not in name and "lm_head" not in name:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def is_vlm_checkpoint(path: str, init_kwargs: dict | None = None) -> bool:
    """True when the checkpoint's config (a local directory or a hub name) has a ``vision_config`` (OpenRLHF's
    test, ``utils.is_vlm_model``)."""
    from adora_openrlhf.engine.model_source import model_config_dict

    return "vision_config" in model_config_dict(path, init_kwargs)


def load_vlm(path: str, dtype: str = "float32", init_kwargs: dict | None = None, option: str = "model.path"):
    """A vision-language checkpoint, local directory or hub name (``AutoModelForImageTextToText``, as OpenRLHF's
    actor loads it), with ``init_kwargs`` passed to ``from_pretrained``; weights that do not fit its config are
    refused (``model.from_pretrained_checked``)."""
    from transformers import AutoModelForImageTextToText

    from adora_openrlhf.engine.model import DTYPES, from_pretrained_checked

    return from_pretrained_checked(
        AutoModelForImageTextToText, path, option, dtype=DTYPES[dtype], **(init_kwargs or {})
    )


def load_processor(path: str, init_kwargs: dict | None = None):
    """The checkpoint's processor (``AutoProcessor``); when its video processor cannot be built (no torchvision,
    no video config), :func:`image_only_processor_class`'s processor from the same files. Sets the tokenizer's pad token to eos when it has none."""
    from transformers import AutoProcessor

    from adora_openrlhf.engine.model_source import loader_kwargs

    try:
        processor = AutoProcessor.from_pretrained(path, **loader_kwargs(init_kwargs))
    except (ImportError, OSError) as err:  # the video processor: torchvision missing, or no video config saved
        try:
            processor = image_only_processor_class().from_pretrained(path, **loader_kwargs(init_kwargs))
        except Exception:  # noqa: BLE001 - whatever the fallback's failure, the first error is the one to report
            raise err from None
    if not hasattr(processor, "image_processor"):
        raise ConfigError(
            f"model.path: {path!r} has no image processor; data.task 'geometry' needs a vision-language checkpoint"
        )
    tok = processor.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return processor


# ---------------------------------------------------------------------------------------------------------
# Prompts and image inputs
# ---------------------------------------------------------------------------------------------------------


def load_image(ref: Any):
    """An RGB PIL image from a PIL image or a file path."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    with Image.open(ref) as image:
        return image.convert("RGB")


def content_list(text: str) -> list[dict[str, str]]:
    """``"<image>Find x."`` -> ``[{"type": "image"}, {"type": "text", "text": "Find x."}]`` (OpenRLHF's convention)."""
    parts = text.split(IMAGE_TAG)
    out: list[dict[str, str]] = [{"type": "text", "text": parts[0]}] if parts[0].strip() else []
    for part in parts[1:]:
        out.append({"type": "image"})
        if part.strip():
            out.append({"type": "text", "text": part})
    return out


def render_vlm_prompt(prompt: Any, processor, template: str) -> str:
    """Prompt text with one vision block per ``<image>`` tag: ``chat`` (or ``auto`` with a chat template) applies
    the processor's chat template to content lists; ``compact`` is the last user message, tags replaced by
    :data:`IMAGE_BLOCK`, and a newline."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    use_chat = template == "chat" or (template == "auto" and getattr(processor, "chat_template", None))
    if use_chat:
        if not getattr(processor, "chat_template", None):
            raise ValueError(
                "data.prompt_template: 'chat' needs a processor with a chat template; use 'compact' for this model"
            )
        for m in messages:
            if isinstance(m.get("content"), str):
                m["content"] = content_list(m["content"])
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    users = [m["content"] for m in messages if m.get("role", "user") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError("prompt: no user message (a string with <image> tags) to build a compact prompt from")
    return users[-1].strip().replace(IMAGE_TAG, IMAGE_BLOCK) + "\n"


def encode_vlm_prompts(
    processor, texts: Sequence[str], images: Sequence[Sequence[Any]], max_tokens: int, where: str | Sequence[str]
):
    """(prompt token ids, extra model inputs) per prompt. Each text must hold one vision block per image; a
    mismatch, an image that cannot be decoded or a prompt over ``max_tokens`` (image tokens included) raises
    naming the row (``where``: one location such as ``train.jsonl:7`` per prompt, or a name for all, then rows
    are numbered from 1)."""
    ids_out: list[list[int]] = []
    extras: list[dict[str, torch.Tensor] | None] = []
    for i, (text, refs) in enumerate(zip(texts, images, strict=True)):
        at = f"{where}:{i + 1}" if isinstance(where, str) else where[i]
        blocks = text.count("<|image_pad|>")
        if blocks != len(refs):
            raise ConfigError(
                f"{at}: field 'images': {len(refs)} image(s) for {blocks} image slot(s) (<image> tags) in the prompt"
            )
        if refs:
            decoded = [_decoded(r, f"{at}: field 'images[{k}]'") for k, r in enumerate(refs)]
            out = processor(text=[text], images=decoded, add_special_tokens=False, return_tensors="pt")
            extras.append({k: out[k] for k in EXTRA_INPUT_KEYS})
        else:
            out = processor(text=[text], add_special_tokens=False, return_tensors="pt")
            extras.append(None)
        ids = out["input_ids"][0].tolist()
        if len(ids) > max_tokens:
            raise ConfigError(
                f"{at}: field 'prompt': {len(ids)} tokens (image tokens included), more than "
                f"data.max_prompt_tokens={max_tokens}; raise it or use smaller images"
            )
        ids_out.append(ids)
    return ids_out, extras


def _decoded(ref: Any, at: str):
    """:func:`load_image`, with a ConfigError ``AT: ...`` naming the file when it cannot be decoded."""
    try:
        return load_image(ref)
    except Exception as err:  # noqa: BLE001 - PIL: OSError (truncated), UnidentifiedImageError, DecompressionBombError, ...
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise ConfigError(
            f"{at}: the image file {ref!r} cannot be decoded ({reason}); it is damaged or not an image: replace it"
        ) from None


def vision_token_ids(model) -> list[int]:
    """Ids of the vision special tokens of ``model`` (never sampled: a generated ``<|image_pad|>`` would have no pixels)."""
    config = model.config
    return [
        getattr(config, k)
        for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        if getattr(config, k, None) is not None
    ]


def extra_model_inputs(
    model, input_ids: torch.Tensor, extras: Sequence[dict[str, torch.Tensor] | None]
) -> dict[str, torch.Tensor]:
    """Model keyword inputs for a batch whose sequence ``b`` belongs to a prompt with extra inputs ``extras[b]``:
    each key concatenated over the batch (dim 0, batch order), and ``mm_token_type_ids`` (1 at ``<|image_pad|>``).
    Empty when no sequence has extra inputs (text-only models and rows)."""
    present = [e for e in extras if e]
    if not present:
        return {}
    device = input_ids.device
    merged = {k: torch.cat([e[k] for e in present], dim=0).to(device) for k in present[0]}
    merged["mm_token_type_ids"] = (input_ids == model.config.image_token_id).to(torch.int32)
    return merged
