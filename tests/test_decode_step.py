"""The one-token decoding step (backends/local/decode_step.py) gives the model's own logits, bitwise."""

from __future__ import annotations

import pytest
import torch

from adora_openrlhf.backends.local.decode_step import decode_step_for
from adora_openrlhf.backends.local.kv_cache import attention_reads_cache, growing_cache_for


def _qwen2(kv_heads: int = 1, attn: str = "sdpa", seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        attn_implementation=attn,
    )
    return Qwen2ForCausalLM(config).eval()


def _prompts(padded: bool, batch: int = 5, width: int = 7, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 97, (batch, width), generator=generator)
    mask = torch.ones(batch, width, dtype=torch.long)
    if padded:
        for row, pad in enumerate([0, 3, 1, 5, 2][:batch]):
            ids[row, :pad], mask[row, :pad] = 0, 0
    return ids, mask


def _cache(model, repeated: bool, rows: int):
    # repeated: the growing cache stores each key/value head once per query head (CPU, small batch); else one entry per head
    return growing_cache_for(model, rows * 64 if repeated else None)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("repeated", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_step_logits_equal_the_forward_bitwise(padded, repeated, kv_heads):
    model = _qwen2(kv_heads)
    ids, mask = _prompts(padded)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    caches = [_cache(model, repeated, ids.shape[0]) for _ in range(2)]
    step = decode_step_for(model, caches[1])
    assert step is not None
    with torch.no_grad(), attention_reads_cache(model, caches[0]):
        logits = []
        for cache in caches:  # the same prefill into both caches
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits.append(out.logits[:, -1])
        generator = torch.Generator().manual_seed(2)
        pos = positions[:, -1:]
        for index in range(12):
            tokens = torch.randint(3, 97, (ids.shape[0], 1), generator=generator)
            mask, pos = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], -1), pos + 1
            want = model(input_ids=tokens, attention_mask=mask, position_ids=pos, past_key_values=caches[0], use_cache=True, logits_to_keep=1).logits[:, -1]
            got = step(tokens, pos, mask)
            assert got.shape == (ids.shape[0], 97) and torch.equal(got, want), f"step {index}"
            if index == 5:  # compaction: keep rows 1, 3 and 4 in both caches (row 1 and 3 are padded ones)
                keep = torch.tensor([1, 3, 4])
                for cache in caches:
                    for layer in cache.layers:
                        layer.batch_select_indices(keep)
                mask, pos, ids = mask[keep], pos[keep], ids[keep]
    for first, second in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(first.keys, second.keys) and torch.equal(first.values, second.values)


def test_compact_decoding_gives_the_same_tokens_with_and_without_the_step():
    from adora_openrlhf.backends.local.decoding import compact_decode
    from adora_openrlhf.config import SamplingParams

    model = _qwen2(2)
    ids, mask = _prompts(True)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=20)
    uniforms = torch.rand(ids.shape[0], 20, generator=torch.Generator().manual_seed(3))
    runs = {}
    for fast in (False, True):
        for greedy in (False, True):
            cache = growing_cache_for(model, ids.shape[0] * 40)
            with attention_reads_cache(model, cache):
                runs[fast, greedy] = compact_decode(model, ids, mask, params, 96, 0, cache, greedy=greedy, uniforms=uniforms, fast_step=fast)
    assert runs[True, False] == runs[False, False] and runs[True, True] == runs[False, True]
    assert any(len(ids) > 1 for ids, _ in runs[True, False])


def test_models_the_step_does_not_cover_keep_their_forward():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _qwen2()
    assert decode_step_for(model, None) is None  # no cache to write into
    assert decode_step_for(_qwen2(attn="eager"), growing_cache_for(model)) is None  # eager attention: other arithmetic
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)).eval()
    assert decode_step_for(llama, growing_cache_for(llama)) is None
    hooked = _qwen2()
    hooked.model.register_forward_hook(lambda *args: None)
    assert decode_step_for(hooked, growing_cache_for(hooked)) is None


def test_lora_wrapped_projections_keep_the_forward():
    peft = pytest.importorskip("peft")
    model = _qwen2()
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    base = lora.get_base_model()
    assert decode_step_for(base, growing_cache_for(base)) is None
    assert decode_step_for(lora, growing_cache_for(base)) is None
