"""Images through the cluster backend's code on CPU: OpenRLHF 0.11.2's own VLM helpers and actor with the tiny
Qwen2.5-VL of the local backend.

The chain a Geometry3K-style row takes in OpenRLHF: ``PromptDataset``'s ``preprocess_data`` (``<image>`` tags ->
content list -> the processor's chat template), the agent's ``process_prompt_with_images`` (processor call; keeps
``pixel_values`` and ``image_grid_thw``), ``dedup_media_tokens`` (one placeholder per image for vLLM),
``merge_mm_train_inputs`` (the batch of an ``Experience``) and ``Actor.forward`` (rebuilds
``mm_token_type_ids`` from the sequence for Qwen's M-RoPE). Each step is compared with the local backend's
path (``engine/vlm.py``); the actor's log-probs must equal the local update's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))

import torch

from adora_openrlhf.backends.local.update import pack, token_log_probs
from adora_openrlhf.config import TinyModelConfig, TinyVisionConfig
from adora_openrlhf.data_prep import geo_synth as geo_synth_files
from adora_openrlhf.engine import vlm
from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
from adora_openrlhf.tasks import geo_synth
from gpu_stubs import import_openrlhf

actor_module, vlm_utils, prompts_dataset, orl_utils = import_openrlhf(
    "openrlhf.models.actor", "openrlhf.utils.vlm_utils", "openrlhf.datasets.prompts_dataset", "openrlhf.utils.utils"
)

TEXT = TinyModelConfig(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)
VISION = TinyVisionConfig(image_size=32, patch_size=8, depth=1, hidden_size=16, intermediate_size=32, num_heads=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved tiny Qwen2.5-VL + processor and three geo_synth rows as OpenRLHF reads them (JSONL, PNG paths)."""
    root = tmp_path_factory.mktemp("orl_vlm")
    rows = geo_synth.generate_rows(3, 0)
    tokenizer = train_bpe_tokenizer(
        [r["prompt"] for r in rows] + [r["meta"]["solution_text"] for r in rows], TEXT.vocab_size
    )
    processor = vlm.build_tiny_processor(tokenizer, VISION)
    vlm.build_tiny_vlm(TEXT, VISION, tokenizer, seed=0).save_pretrained(str(root / "model"))
    processor.save_pretrained(str(root / "model"))
    path = geo_synth_files.write_split(rows, root / "data", "train")
    return root / "model", [json.loads(line) for line in path.read_text().splitlines()]


def test_openrlhf_prompt_and_image_processing_match_the_local_path(checkpoint):
    path, rows = checkpoint
    assert orl_utils.is_vlm_model(str(path))  # OpenRLHF would load it with AutoModelForImageTextToText and a processor
    processor = vlm.load_processor(str(path))
    for row in rows:
        prompt, label = prompts_dataset.preprocess_data(
            row, None, "prompt", "reward_label", apply_chat_template=processor.apply_chat_template
        )
        assert prompt == vlm.render_vlm_prompt(row["prompt"], processor, "auto")
        assert json.loads(label)["source"] == "geo_synth"
        ids, mm, images = vlm_utils.process_prompt_with_images(processor, prompt, row["images"])
        ours_ids, ours_mm = vlm.encode_vlm_prompts(processor, [prompt], [row["images"]], 256, "row")
        assert ids == ours_ids[0]
        assert set(mm) == set(vlm.EXTRA_INPUT_KEYS)  # OpenRLHF drops mm_token_type_ids and rebuilds it in Actor.forward
        assert all(torch.equal(mm[k], ours_mm[0][k]) for k in vlm.EXTRA_INPUT_KEYS) and len(images) == 1
        image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        # what vLLM receives
        assert ids.count(image_id) == 4 and vlm_utils.dedup_media_tokens(ids, {image_id}).count(image_id) == 1


def test_openrlhf_actor_log_probs_equal_the_local_update(checkpoint):
    """OpenRLHF's Actor (loaded from the path, so ``is_vlm``) on an Experience-style batch: left-padded prompts,
    right-padded responses, multimodal inputs merged by ``merge_mm_train_inputs``."""
    path, rows = checkpoint
    processor = vlm.load_processor(str(path))
    actor = actor_module.Actor(str(path), attn_implementation="sdpa", param_dtype="bf16")
    assert actor.is_vlm and type(actor.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    actor.model.float().eval()  # OpenRLHF loads bf16; compare in float32
    prompts, per_sample = [], []
    for row in rows:
        prompt, _ = prompts_dataset.preprocess_data(
            row, None, "prompt", apply_chat_template=processor.apply_chat_template
        )
        ids, mm, _ = vlm_utils.process_prompt_with_images(processor, prompt, row["images"])
        prompts.append(ids)
        per_sample.append(mm)
    prompts[1] = prompts[1] + prompts[1][-2:]  # unequal prompt lengths
    responses = [[40, 41, 42, 43], [44, 45], [46, 47, 48]]
    pad = processor.tokenizer.pad_token_id
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    sequences = torch.tensor(
        [
            [pad] * (p_width - len(p)) + p + r + [pad] * (r_width - len(r))
            for p, r in zip(prompts, responses, strict=True)
        ]
    )
    attention = torch.tensor(
        [
            [0] * (p_width - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_width - len(r))
            for p, r in zip(prompts, responses, strict=True)
        ]
    )
    action_mask = torch.tensor([[1] * len(r) + [0] * (r_width - len(r)) for r in responses])
    mm = vlm_utils.merge_mm_train_inputs([per_sample], "cpu")
    with torch.no_grad():
        theirs = actor(sequences, action_mask=action_mask, attention_mask=attention, **mm)
        ours = token_log_probs(actor.model, pack(prompts, responses, pad, per_sample))
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        assert torch.allclose(theirs[b, : len(r)], ours[b, len(p) - 1 : len(p) - 1 + len(r)], atol=1e-5)
