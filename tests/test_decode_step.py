"""The one-token decoding step (engine/decode_step.py) gives the model's own logits, bitwise."""

from __future__ import annotations

import pytest
import torch

from adora_openrlhf.engine.decode_step import decode_step_for
from adora_openrlhf.engine.kv_cache import attention_reads_cache, growing_cache_for


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


def _steps_against_the_forward(model, padded: bool, caches, step, check) -> None:
    """The same prefill into both caches, then 12 one-token steps: the forward on ``caches[0]`` against ``step`` on
    ``caches[1]``, ``check(got, want, index)`` at each; after step 5 both caches keep rows 1, 3 and 4 (a compaction;
    rows 1 and 3 are padded ones)."""
    ids, mask = _prompts(padded)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad(), attention_reads_cache(model, caches[0]):
        for cache in caches:
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        generator = torch.Generator().manual_seed(2)
        pos = positions[:, -1:]
        for index in range(12):
            tokens = torch.randint(3, 97, (ids.shape[0], 1), generator=generator)
            mask, pos = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], -1), pos + 1
            want = model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=caches[0],
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
            check(step(tokens, pos, mask), want, index)
            if index == 5:
                keep = torch.tensor([1, 3, 4])
                for cache in caches:
                    for layer in cache.layers:
                        layer.batch_select_indices(keep)
                mask, pos, ids = mask[keep], pos[keep], ids[keep]


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("repeated", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_step_logits_equal_the_forward_bitwise(padded, repeated, kv_heads):
    model = _qwen2(kv_heads)
    caches = [_cache(model, repeated, 5) for _ in range(2)]
    step = decode_step_for(model, caches[1])
    assert step is not None

    def check(got, want, index):
        assert got.shape == want.shape == (want.shape[0], 97) and torch.equal(got, want), f"step {index}"

    _steps_against_the_forward(model, padded, caches, step, check)
    for first, second in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(first.keys, second.keys) and torch.equal(first.values, second.values)


def test_compact_decoding_gives_the_same_tokens_with_and_without_the_step():
    from adora_openrlhf.config import SamplingParams
    from adora_openrlhf.engine.decoding import compact_decode

    model = _qwen2(2)
    ids, mask = _prompts(True)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=20)
    uniforms = torch.rand(ids.shape[0], 20, generator=torch.Generator().manual_seed(3))
    runs = {}
    for fast in (False, True):
        for greedy in (False, True):
            cache = growing_cache_for(model, ids.shape[0] * 40)
            with attention_reads_cache(model, cache):
                runs[fast, greedy] = compact_decode(
                    model, ids, mask, params, 96, 0, cache, greedy=greedy, uniforms=uniforms, fast_step=fast
                )
    assert runs[True, False] == runs[False, False] and runs[True, True] == runs[False, True]
    assert any(len(ids) > 1 for ids, _ in runs[True, False])


def test_models_the_step_does_not_cover_keep_their_forward():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _qwen2()
    assert decode_step_for(model, None) is None  # no cache to write into
    assert decode_step_for(_qwen2(attn="eager"), growing_cache_for(model)) is None  # eager attention: other arithmetic
    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    ).eval()
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


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_fast_step_logits_are_the_forwards_within_rounding(padded, kv_heads):
    """The ``fast`` step (eval.run's numerics) on a cache with one entry per key/value head: the forward's logits to
    float rounding at every step, across a compaction, and the same argmax."""
    model = _qwen2(kv_heads)
    caches = [growing_cache_for(model) for _ in range(2)]
    step = decode_step_for(model, caches[1], numerics="fast")
    assert step is not None

    def check(got, want, index):
        assert got.shape == want.shape and torch.isfinite(got).all()
        assert torch.allclose(got, want, rtol=0, atol=1e-5), f"step {index}: {(got - want).abs().max():.2e}"
        assert torch.equal(got.argmax(-1), want.argmax(-1))

    _steps_against_the_forward(model, padded, caches, step, check)


def test_grouped_attention_hand_case():
    """Two query heads on one key/value head, two cached positions, the second masked: each head attends only to
    position 0, so its output is that position's value."""
    from adora_openrlhf.engine.decode_step import grouped_attention

    query = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [B=1, kv_heads=1, g=2, D=2]
    keys = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [1, 1, T=2, D]
    values = torch.tensor([[[[2.0, 3.0], [5.0, 7.0]]]])
    mask = torch.tensor([0.0, float("-inf")]).view(1, 1, 1, 2)
    assert torch.equal(grouped_attention(query, keys, values, mask, 1.0), torch.tensor([[[[2.0, 3.0], [2.0, 3.0]]]]))
    unmasked = grouped_attention(query, keys, values, None, 1.0)
    weight = torch.softmax(torch.tensor([1.0, 0.0]), -1)  # head 0: scores (1, 0); head 1: (0, 1)
    assert torch.allclose(unmasked[0, 0, 0], weight[0] * values[0, 0, 0] + weight[1] * values[0, 0, 1])
    assert torch.allclose(unmasked[0, 0, 1], weight[1] * values[0, 0, 0] + weight[0] * values[0, 0, 1])


def test_fast_step_refuses_a_repeated_cache_and_unknown_steps():
    model = _qwen2(2)
    with pytest.raises(ValueError, match="repeated"):
        decode_step_for(model, growing_cache_for(model, 5 * 64), numerics="fast")
    with pytest.raises(ValueError, match="unknown step 'flash'"):
        decode_step_for(model, growing_cache_for(model), numerics="flash")


def test_fast_steps_rotary_table_grows_past_its_first_positions():
    """Positions beyond the rotary table's first 256 entries (a long prompt or response): still the forward's logits."""
    model = _qwen2(2)
    ids, mask = _prompts(False, batch=2)
    positions = (
        mask.cumsum(-1) - 1
    ) + 300  # positions 300.. (the model has 128 and extrapolates; the arithmetic is what is compared)
    caches = [growing_cache_for(model) for _ in range(2)]
    step = decode_step_for(model, caches[1], numerics="fast")
    with torch.no_grad():
        for cache in caches:
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        tokens, pos = ids[:, -1:], positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(2, 1)], -1)
        want = model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=caches[0],
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        assert torch.allclose(step(tokens, pos, mask), want, rtol=0, atol=1e-5)


def test_an_unchecked_transformers_release_falls_back_to_the_forward_with_one_log_line(monkeypatch, caplog):
    import logging

    import transformers

    from adora_openrlhf.engine import decode_step

    model = _qwen2()
    assert decode_step_for(model, growing_cache_for(model)) is not None  # the release these tests pin
    monkeypatch.setattr(transformers, "__version__", "9.1.0")
    monkeypatch.setattr(decode_step, "_version_logged", set())
    with caplog.at_level(logging.INFO, logger="adora_openrlhf.engine.decode_step"):
        assert decode_step_for(model, growing_cache_for(model)) is None
        assert decode_step_for(model, growing_cache_for(model), "fast") is None
    lines = [r.getMessage() for r in caplog.records if "9.1.0" in r.getMessage()]
    assert lines == [
        "transformers 9.1.0 is not a release the one-token step was checked against (5.15): decoding calls the model's forward for every token instead"
    ]
