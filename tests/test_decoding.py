"""Compact decoding (engine/decoding.py) against transformers' model.generate: greedy tokens equal with
rows leaving the batch; sampled tokens equal under the same seed when nothing is compacted, with every logits
processor; the compacted batch really shrinks; the generate fallback for vision prompts and the config field;
inverse-CDF sampling from per-row random streams, whose tokens do not depend on the batch."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.config import ConfigError, ModelConfig, SamplingParams, TinyModelConfig
from adora_openrlhf.engine import decoding
from adora_openrlhf.engine.model import build_tiny_model
from adora_openrlhf.engine.rollout import generate_responses
from adora_openrlhf.engine.tokenization import train_bpe_tokenizer

TINY = TinyModelConfig(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)
CORPUS = [
    "Knights always tell the truth. Alice says: Bob is a knave.",
    "<think>Alice knight.</think>\n<answer>(1) Alice is a knight</answer>",
] * 5
TEXTS = [
    "Alice says",
    "Knights always tell the truth. Alice",
    "Bob is a knave.",
    "<think>Alice",
    "Carol",
    "says: Bob",
    "truth",
    "knave. Bob says",
]


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(CORPUS, 300)


@pytest.fixture
def model(tok):
    """A random tiny model that ends a response (eos) whenever its last input token id is a multiple of 5, so the
    responses of one batch end at different lengths, as the testbed's shortcuts and reasoning traces do."""
    model = build_tiny_model(TINY, tok, seed=0).eval()
    last_token = {}

    def remember_input(module, args, kwargs):
        last_token["ids"] = kwargs["input_ids"][:, -1]

    def favour_eos(module, args, logits):
        boost = (last_token["ids"] % 5 == 0).to(logits.dtype) * 30.0
        return logits.index_add(
            -1, torch.tensor([tok.eos_token_id]), boost.view(-1, 1, 1).expand(*logits.shape[:-1], 1)
        )

    model.register_forward_pre_hook(remember_input, with_kwargs=True)
    model.lm_head.register_forward_hook(favour_eos)
    return model


def _prompts(tok, copies=3):
    return [tok.encode(t) for t in TEXTS] * copies


def _both(model, tok, params, greedy, batch_size=16, seed=3):
    out = {}
    for way in ("generate", "compact"):
        torch.manual_seed(seed)
        out[way] = generate_responses(model, tok, _prompts(tok), params, batch_size, greedy=greedy, decoding=way)
    return out


def test_greedy_tokens_equal_generate_while_rows_leave_the_batch(model, tok, monkeypatch):
    shrinks = []
    select = decoding._select_rows
    monkeypatch.setattr(decoding, "_select_rows", lambda cache, keep: (shrinks.append(len(keep)), select(cache, keep)))
    out = _both(model, tok, SamplingParams(temperature=1.0, max_new_tokens=60), greedy=True)
    assert out["compact"] == out["generate"]
    lengths = sorted({len(ids) for ids, _ in out["compact"]})
    assert len(lengths) >= 3 and any(not truncated for _, truncated in out["compact"]), lengths
    assert shrinks and shrinks == sorted(shrinks, reverse=True), shrinks  # the batch got smaller, step by step


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=40),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=40),
        SamplingParams(temperature=1.3, min_p=0.05, repetition_penalty=1.2, max_new_tokens=40),
    ],
)
def test_sampled_tokens_equal_generate_without_compaction(model, tok, monkeypatch, params):
    monkeypatch.setattr(decoding, "COMPACT_RATIO", 0.0)  # never compact: the same rows draw the same random numbers
    out = _both(model, tok, params, greedy=False)
    assert out["compact"] == out["generate"]
    assert len({len(ids) for ids, _ in out["compact"]}) >= 2


def test_sampled_compact_decoding_ends_rows_at_eos_and_flags_truncation(model, tok):
    params = SamplingParams(temperature=1.0, max_new_tokens=25)
    torch.manual_seed(0)
    out = generate_responses(model, tok, _prompts(tok, copies=4), params, 32, decoding="compact")
    eos = tok.eos_token_id
    for ids, truncated in out:
        assert 1 <= len(ids) <= params.max_new_tokens
        assert truncated == (eos not in ids)
        assert eos not in ids[:-1]  # nothing after the first eos
        assert truncated or ids[-1] == eos
        assert tok.pad_token_id not in ids or tok.pad_token_id == eos


def test_decoding_setting_picks_the_loop(model, tok, monkeypatch):
    import adora_openrlhf.engine.rollout as rollout

    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return decoding.compact_decode(*args, **kwargs)

    monkeypatch.setattr(rollout, "compact_decode", spy)
    params = SamplingParams(temperature=1.0, max_new_tokens=5)
    generate_responses(model, tok, _prompts(tok, 1), params, 8, decoding="generate")
    assert calls == []
    generate_responses(model, tok, _prompts(tok, 1), params, 8, decoding="compact")
    assert calls == [1]  # text prompts of a full-attention model take the compact loop
    monkeypatch.setattr(rollout, "full_attention_only", lambda model: False)
    generate_responses(model, tok, _prompts(tok, 1), params, 8, decoding="compact")
    assert calls == [1]  # sliding-window layers: model.generate with its own cache


def test_decoding_setting_is_validated():
    assert ModelConfig().decoding == "compact"
    with pytest.raises(ConfigError, match=r"model\.decoding.*compact"):
        ModelConfig(decoding="beam")


def test_numerics_setting_is_validated_and_reaches_the_decoding_loop(model, tok, monkeypatch):
    """``model.numerics`` names the choices of ``decoding.NUMERICS``, is refused with ``model.decoding generate``
    (transformers' own loop has one arithmetic) and is what compact decoding is called with."""
    import adora_openrlhf.engine.rollout as rollout
    from adora_openrlhf.config import NUMERICS
    from adora_openrlhf.engine.rollout import GenerationSettings

    assert tuple(decoding.NUMERICS) == NUMERICS
    assert ModelConfig().numerics == "exact"
    with pytest.raises(ConfigError, match=r"model\.numerics: unknown numerics 'quick'; choose one of"):
        ModelConfig(numerics="quick")
    with pytest.raises(
        ConfigError, match=r"model\.numerics: 'fast' .* set model\.decoding compact or model\.numerics exact"
    ):
        ModelConfig(numerics="fast", decoding="generate")
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["numerics"])
        return decoding.compact_decode(*args, **kwargs)

    monkeypatch.setattr(rollout, "compact_decode", spy)
    params = SamplingParams(temperature=1.0, max_new_tokens=5)
    for name in NUMERICS:
        settings = GenerationSettings.of(ModelConfig(numerics=name, generation_batch_size=8))
        assert settings.numerics == name
        seen.clear()
        settings.generate(model, tok, _prompts(tok, 2), params)
        assert seen and set(seen) == {name}  # every batch


def test_inverse_cdf_sample_hand_case():
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]] * 6)
    # cdf = [0.2, 0.2, 0.7, 1.0]: token j for u in [cdf[j-1], cdf[j]); token 1 (probability 0) owns an empty interval
    uniforms = torch.tensor([0.0, 0.1999, 0.2, 0.6999, 0.7, 0.9999])
    assert decoding.inverse_cdf_sample(probs, uniforms).tolist() == [0, 0, 2, 2, 3, 3]
    unnormalised = torch.tensor([[2.0, 0.0, 5.0, 3.0]])  # intervals scale with the row's total
    assert decoding.inverse_cdf_sample(unnormalised, torch.tensor([0.5])).tolist() == [2]


@given(
    weights=st.lists(st.sampled_from([0.0, 0.0, 1e-6, 0.1, 0.5, 1.0, 3.0]), min_size=1, max_size=12).filter(
        lambda w: sum(w) > 0
    ),
    u=st.floats(0.0, 1.0, exclude_max=True),
)
def test_inverse_cdf_sample_draws_inside_the_tokens_interval(weights, u):
    probs = torch.tensor([weights], dtype=torch.float64)
    token = int(decoding.inverse_cdf_sample(probs, torch.tensor([u], dtype=torch.float64))[0])
    cdf = probs[0].cumsum(0)
    assert weights[token] > 0  # a token of probability 0 is never drawn
    below = float(cdf[token - 1]) if token else 0.0
    assert below <= u * float(cdf[-1]) < float(cdf[token])


def test_inverse_cdf_sample_frequencies_follow_the_probabilities():
    probs = torch.tensor([0.1, 0.0, 0.25, 0.4, 0.25])
    n = 2000
    uniforms = (torch.arange(n, dtype=torch.float32) + 0.5) / n  # an even grid of u: counts are n * p to within 1
    counts = torch.bincount(decoding.inverse_cdf_sample(probs.expand(n, -1), uniforms), minlength=5)
    assert (counts - n * probs).abs().max() <= 1


def test_rows_with_their_own_streams_draw_the_same_tokens_in_any_batch(model, tok):
    """Per-row uniform streams: a row's sampled tokens do not depend on the rows beside it, nor on compaction."""
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=30)
    prompts = _prompts(tok, copies=2)
    uniforms = torch.rand(len(prompts), params.max_new_tokens, generator=torch.Generator().manual_seed(5))
    ended = []
    together = generate_responses(model, tok, prompts, params, 16, uniforms=uniforms, on_finish=ended.append)
    alone = [
        generate_responses(model, tok, [p], params, 1, uniforms=uniforms[i : i + 1])[0] for i, p in enumerate(prompts)
    ]
    reversed_batch = generate_responses(model, tok, prompts[::-1], params, 5, uniforms=uniforms.flip(0))[::-1]
    assert together == alone == reversed_batch
    assert sum(ended) == len(prompts)  # every row reported once, when it ended or hit the limit
    assert len({tuple(ids) for ids, _ in together}) > len(TEXTS)  # the copies of a prompt drew different responses
    with pytest.raises(ValueError, match="compact decoding"):
        generate_responses(model, tok, prompts[:1], params, 1, decoding="generate", uniforms=uniforms[:1])


def _top_p_both(scores: torch.Tensor, top_p: float):
    from transformers import TopPLogitsWarper

    want = TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1)(None, scores)
    got = decoding.candidate_top_p_warper(top_p)(None, scores)
    return want, got


def test_candidate_top_p_hand_case():
    # probabilities 0.5, 0.3, 0.15, 0.05 and 16 impossible tokens; ascending cumulative sums 0.05, 0.2, 0.5, 1.0
    scores = torch.full((2, 20), float("-inf"))
    scores[:, :4] = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    for top_p, kept in ((0.9, [0, 1, 2]), (0.75, [0, 1]), (0.3, [0]), (0.999, [0, 1, 2, 3])):
        want, got = _top_p_both(scores, top_p)
        assert torch.isfinite(got[0]).nonzero().squeeze(1).tolist() == kept, top_p
        assert torch.equal(got, want)


@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 6),
    vocab=st.integers(1, 500),
    sharpness=st.sampled_from([0.0, 0.5, 2.0, 8.0, 30.0]),
    top_p=st.sampled_from([0.05, 0.5, 0.8, 0.9, 0.95, 0.99]),
)
def test_candidate_top_p_keeps_the_tokens_the_full_sort_keeps(seed, rows, vocab, sharpness, top_p):
    """Same output as transformers' TopPLogitsWarper: from flat rows (all tokens candidates: the full sort is used)
    to peaked ones (a few candidates from topk)."""
    scores = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * sharpness
    want, got = _top_p_both(scores, top_p)
    assert got.shape == scores.shape
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(
        got[torch.isfinite(got)], want[torch.isfinite(want)]
    )
    assert torch.isfinite(got).any(dim=-1).all()  # at least one token kept per row


def test_shared_prefill_runs_each_prompt_once_and_copies_it(model, tok):
    from adora_openrlhf.engine.kv_cache import growing_cache_for
    from adora_openrlhf.engine.rollout import left_padded

    prompts = [tok.encode(t) for t in TEXTS[:3]]
    ids, mask = left_padded([p for p in prompts for _ in range(4)], tok.pad_token_id)  # 3 prompts x 4 samples
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    batches = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    caches = [growing_cache_for(model), growing_cache_for(model)]
    with torch.no_grad():
        alone = decoding.prefill(model, ids, mask, positions, caches[0])
        shared = decoding.prefill(model, ids, mask, positions, caches[1], share_prompts=True)
    assert batches == [12, 3]
    assert shared.shape == alone.shape == (12, model.config.vocab_size) and shared.dtype == torch.float32
    assert torch.allclose(shared, alone, atol=1e-5, rtol=0)
    for first, second in zip(caches[0].layers, caches[1].layers, strict=True):
        assert first.keys.shape == second.keys.shape and torch.allclose(first.keys, second.keys, atol=1e-5, rtol=0)
        assert torch.allclose(first.values, second.values, atol=1e-5, rtol=0)


def test_fast_numerics_give_the_exact_tokens_on_a_tiny_model(model, tok):
    """numerics="fast" (eval.run's default) against "exact": the same greedy responses, and with per-row streams the
    same sampled ones (they could differ only where a draw falls within float rounding of a boundary)."""
    prompts = [p for p in _prompts(tok, copies=1) for _ in range(3)]
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=30)
    uniforms = torch.rand(len(prompts), params.max_new_tokens, generator=torch.Generator().manual_seed(7))
    for greedy in (True, False):
        streams = None if greedy else uniforms
        runs = [
            generate_responses(model, tok, prompts, params, 16, greedy=greedy, uniforms=streams, numerics=how)
            for how in ("exact", "fast")
        ]
        assert runs[0] == runs[1]
        assert len({len(ids) for ids, _ in runs[0]}) > 1  # rows left the batch at different steps
    with pytest.raises(ValueError, match="numerics: unknown 'quick'"):
        generate_responses(model, tok, prompts[:1], params, 1, numerics="quick")
