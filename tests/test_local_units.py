"""Local backend pieces: tokenizer, prompt templates, packing, rollout log-prob alignment, sampling
parameters, data order, checkpoints, JSONL loading and error messages."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.algorithms.sampling import AdaptiveSampler, GenerationRequest
from adora_openrlhf.backends.local.sft import supervised_warmup
from adora_openrlhf.backends.local.update import pack, token_log_probs
from adora_openrlhf.config import (
    AdaptiveSamplingConfig,
    ConfigError,
    DataConfig,
    ModelConfig,
    SamplingParams,
    TinyModelConfig,
    WarmupConfig,
)
from adora_openrlhf.engine.kv_cache import MIN_CAPACITY, growing_cache_for
from adora_openrlhf.engine.model import apply_lora, build_tiny_model
from adora_openrlhf.engine.rollout import GenerationSettings, RolloutEngine, generate_responses, make_reward_fns
from adora_openrlhf.engine.tokenization import TAG_TOKENS, train_bpe_tokenizer
from adora_openrlhf.prompt_templates import render_prompt
from adora_openrlhf.rewards.kk import kk_reward
from adora_openrlhf.rows import Row, batch_indices, load_run_rows, validate_rows
from adora_openrlhf.rundir import checkpoints as ckpt
from adora_openrlhf.tasks.kk import KKDataConfig
from adora_openrlhf.tasks.kk_demonstrations import direct_demonstration

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


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(CORPUS, 300)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(TINY, tok, seed=0).eval()


def test_tokenizer_round_trip_and_atomic_tags(tok, tmp_path):
    text = "<think>Zoë ünïcode 123</think>\n<answer>(1) Alice is a knight</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == text
    for tag in TAG_TOKENS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
    assert tok.pad_token == tok.eos_token == "<|endoftext|>"
    tok.save_pretrained(str(tmp_path / "t"))
    from adora_openrlhf.engine.tokenization import load_tokenizer

    again = load_tokenizer(str(tmp_path / "t"))
    assert again(text, add_special_tokens=False)["input_ids"] == ids


def test_vocab_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(CORPUS, 100)


def test_prompt_templates(tok):
    messages = [{"role": "system", "content": "long system prompt"}, {"role": "user", "content": " Who is a knight? "}]
    assert render_prompt(messages, tok, "compact") == "Who is a knight?\n"
    assert render_prompt(messages, tok, "auto") == "Who is a knight?\n"  # no chat template -> compact
    with pytest.raises(ValueError, match="chat template"):
        render_prompt(messages, tok, "chat")
    tok2 = train_bpe_tokenizer(CORPUS, 300)
    tok2.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    assert render_prompt(messages, tok2, "auto") == "<system>long system prompt<user> Who is a knight? <assistant>"


def test_pack_hand_case():
    b = pack([[5, 6], [7]], [[8, 9, 0], [1]], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 8, 9, 0], [7, 1, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # next-token positions: row 0 predicts 8, 9, 0 from positions 1, 2, 3; row 1 predicts 1 from position 0
    assert b.action_mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_does_not_depend_on_micro_batch_size(tok, loss_agg):
    """One SGD step (lr 1, no clipping) moves the weights by minus the gradient: the same for micro-batches of one
    sequence and for the whole batch, in every aggregation mode (responses of 1, 3 and 7 tokens, so a per
    micro-batch token mean would weigh the short response 7x too much)."""
    import copy

    from adora_openrlhf.backends.local.update import policy_update
    from adora_openrlhf.config import PolicyLossConfig

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    responses = [[20], [21, 22, 23], [24, 25, 26, 27, 28, 29, 30]]
    batch = pack(prompts, responses, pad_id=0)
    advantages = torch.tensor([1.0, -0.5, 0.25])
    base = build_tiny_model(TINY, tok, seed=0).double()
    deltas = []
    for micro in (1, 3):
        model = copy.deepcopy(base)
        cfg = PolicyLossConfig(lr=1.0, loss_agg=loss_agg, micro_batch_size=micro, max_grad_norm=1e9)
        policy_update(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, advantages, cfg, norm_length=8)
        deltas.append(
            torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), base.parameters(), strict=True)])
        )
    assert deltas[1].abs().max() > 0
    assert torch.allclose(deltas[0], deltas[1], rtol=1e-5, atol=1e-7)  # log-probs are computed in float32


def test_entropy_hand_cases():
    """Uniform over V gives log V, a one-hot (other entries log 0 = -inf) gives 0, a two-way 1/4, 3/4 split
    gives -(1/4 log 1/4 + 3/4 log 3/4)."""
    import math

    from adora_openrlhf.backends.local.update import entropy_from_log_probs

    V = 7
    uniform = torch.log_softmax(torch.zeros(2, 3, V), dim=-1)
    assert torch.allclose(entropy_from_log_probs(uniform), torch.full((2, 3), math.log(V)))
    one_hot = torch.full((V,), float("-inf"))
    one_hot[3] = 0.0
    assert entropy_from_log_probs(one_hot).item() == 0.0
    split = torch.log(torch.tensor([0.25, 0.75, 0.0]))
    assert entropy_from_log_probs(split).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_update_entropy_is_the_mean_over_response_tokens(tok, ppo_epochs):
    """``train/entropy`` = mean over response tokens only (prompt and padding positions are masked out) of the
    pre-update policy's next-token entropy, computed here independently with torch.distributions."""
    from adora_openrlhf.backends.local.update import policy_update
    from adora_openrlhf.config import PolicyLossConfig

    batch = pack([[5, 6, 7], [8, 9]], [[20], [21, 22, 23]], pad_id=0)
    model = build_tiny_model(TINY, tok, seed=0)
    with torch.no_grad():
        # (tied embeddings) sharper, position-dependent distributions than at init
        model.get_output_embeddings().weight.mul_(10.0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        per_token = torch.distributions.Categorical(logits=logits).entropy()
    expected = float((per_token * batch.action_mask).sum() / batch.action_mask.sum())
    unmasked = float(per_token[batch.attention_mask[:, 1:].bool()].mean())
    assert abs(expected - unmasked) > 1e-4  # the mask matters in this case
    cfg = PolicyLossConfig(lr=1e-2, micro_batch_size=1, ppo_epochs=ppo_epochs)
    out = policy_update(
        model, torch.optim.SGD(model.parameters(), lr=1e-2), batch, torch.tensor([1.0, -1.0]), cfg, norm_length=8
    )
    assert out["train/entropy"] == pytest.approx(expected, rel=1e-5)


def test_rollout_log_probs_match_training_forward(tok, model):
    """Left-padded generation and right-padded training see the same positions: log-probs agree exactly."""
    prompts = [tok("Alice says: Bob is a knave.").input_ids, tok("Bob").input_ids]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_token_id).long()
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        top_k=0,
        max_new_tokens=5,
        min_new_tokens=5,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=None,
    )
    resp = out.sequences[:, width:]
    gen_lp = torch.stack(
        [
            torch.log_softmax(step_logits, -1).gather(-1, resp[:, i : i + 1]).squeeze(-1)
            for i, step_logits in enumerate(out.logits)
        ],
        1,
    )
    with torch.no_grad():
        lp = token_log_probs(model, pack(prompts, resp.tolist(), tok.pad_token_id))
    for i, p in enumerate(prompts):
        assert torch.allclose(gen_lp[i], lp[i, len(p) - 1 : len(p) + 4], atol=1e-5)


def test_generation_honours_sampling_params(tok, model):
    prompts = [tok("Alice says").input_ids] * 3
    short = generate_responses(model, tok, prompts, SamplingParams(max_new_tokens=3), batch_size=2)
    assert all(len(r) <= 3 for r, _ in short) and all(
        t == (len(r) == 3 and tok.eos_token_id not in r) for r, t in short
    )
    greedy = generate_responses(model, tok, prompts, SamplingParams(max_new_tokens=6), batch_size=3, greedy=True)
    top1 = generate_responses(model, tok, prompts, SamplingParams(max_new_tokens=6, top_k=1), batch_size=2)
    assert greedy == top1  # top_k=1 sampling is greedy decoding
    torch.manual_seed(1)
    a = generate_responses(
        model,
        tok,
        prompts,
        SamplingParams(max_new_tokens=6, temperature=1.5, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
        3,
    )
    torch.manual_seed(1)
    b = generate_responses(
        model,
        tok,
        prompts,
        SamplingParams(max_new_tokens=6, temperature=1.5, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
        3,
    )
    assert a == b


def test_engine_batches_requests_by_params_and_scores(tok, model):
    rows = [
        Row(
            prompt="Alice says: Bob is a knave.",
            label="(1) Alice is a knight\n(2) Bob is a knave",
            source="kk",
            meta={"names": ["Alice", "Bob"], "solution": [True, False], "num_people": 2},
        )
    ] * 2
    ids = [tok(r.prompt).input_ids for r in rows]
    engine = RolloutEngine(
        model, tok, ids, rows, make_reward_fns(rows), positive_threshold=1.0, settings=GenerationSettings(4)
    )
    hot = SamplingParams(max_new_tokens=4, temperature=1.3)
    calls = []
    import adora_openrlhf.engine.rollout as rollout

    original = rollout.generate_responses

    def spy(model_, tok_, prompts, params, batch_size, greedy=False, **more):
        calls.append((len(prompts), params))
        return original(model_, tok_, prompts, params, batch_size, greedy, **more)

    rollout.generate_responses = spy
    try:
        reqs = [
            GenerationRequest(0, 2, SamplingParams(max_new_tokens=4), 0),
            GenerationRequest(1, 3, hot, 1),
            GenerationRequest(0, 1, hot, 1),
        ]
        out = engine.generate_fn([1, 0])(reqs)
    finally:
        rollout.generate_responses = original
    assert [len(o) for o in out] == [2, 3, 1]
    assert sorted(c[0] for c in calls) == [2, 4]  # one call per parameter set
    for resp in out[0]:
        assert (
            resp.payload.row_index == 1
            and resp.reward == kk_reward(resp.payload.text, rows[1].label, rows[1].meta).reward
        )
        assert resp.positive == (resp.reward > 1.0) and resp.length == len(resp.payload.response_ids)


def test_sampler_drives_engine(tok, model):
    rows = [
        Row(prompt="Alice says: Bob is a knave.", label="(1) Alice is a knight", source="kk", meta={"names": ["Alice"]})
    ] * 3
    ids = [tok(r.prompt).input_ids for r in rows]
    engine = RolloutEngine(
        model, tok, ids, rows, make_reward_fns(rows), positive_threshold=1.0, settings=GenerationSettings(8)
    )
    cfg = AdaptiveSamplingConfig(
        enabled=True, n_keep=2, samples_per_round=2, max_rounds=2, escalation=[{"temperature": 1.5}]
    )
    result = AdaptiveSampler(cfg, SamplingParams(max_new_tokens=4), seed=0).sample(
        3, engine.generate_fn([0, 1, 2]), step=0
    )
    assert len(result.groups) == 3 and all(len(g.kept) == 2 for g in result.groups)
    assert result.metrics["sampling/responses_generated"] == 12  # nothing is positive for a random model: 2 rounds


@given(st.integers(0, 50), st.integers(1, 10), st.integers(1, 7), st.integers(0, 3))
def test_data_order_is_a_function_of_position(position, count, num_rows, seed):
    whole = batch_indices(0, position + count, num_rows, seed)
    assert batch_indices(position, count, num_rows, seed) == whole[position:]
    for epoch_start in range(0, position + count - num_rows + 1, num_rows):  # each full epoch is a permutation
        assert sorted(whole[epoch_start : epoch_start + num_rows]) == list(range(num_rows))


def test_jsonl_rows_load_and_bad_rows_are_named(tmp_path):
    good = tmp_path / "train.jsonl"
    rows = [
        {"prompt": f"q{i}: is Alice a knight?", "label": "(1) Alice is a knight", "meta": {"names": ["Alice"]}}
        for i in range(6)
    ]
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train, held = load_run_rows(DataConfig(task="kk", train_path=str(good), num_eval=2), seed=0)
    assert len(train) == 4 and len(held) == 2 and train[0].source == "kk"
    ok = {"prompt": "Is Alice a knight?", "label": "(1) Alice is a knight"}
    with pytest.raises(ConfigError, match="train.jsonl:2: field 'label': missing"):  # rows numbered from 1
        validate_rows([ok, {"prompt": "b"}], "train.jsonl", "kk")
    with pytest.raises(ConfigError, match="train.jsonl:7: field 'prompt'"):  # or by their file lines
        validate_rows([ok, {"label": "x"}], "train.jsonl", "kk", lines=[3, 7])
    with pytest.raises(ConfigError, match=r"train.jsonl:1: field 'label': the 'kk' reward cannot parse it"):
        validate_rows([{"prompt": "a", "label": "x"}], "train.jsonl", "kk")
    gen_train, gen_eval = load_run_rows(DataConfig(num_train=10, num_eval=5, kk=KKDataConfig(num_people=[2])), seed=0)
    assert not {repr(r.prompt) for r in gen_train} & {repr(r.prompt) for r in gen_eval}


def test_demonstration_scores_full_reward():
    from adora_openrlhf.tasks.kk import generate_rows

    for raw in generate_rows(5, [2, 3], seed=3):
        row = Row(raw["prompt"], raw["label"], raw["source"], raw["meta"])
        result = kk_reward(direct_demonstration(row), row.label, row.meta)
        assert result.correct and result.reward == 3.0


def test_warmup_lowers_loss(tok):
    m = build_tiny_model(TINY, tok, seed=0)
    rows = [
        Row("Alice says: Bob is a knave.", "(1) Alice is a knight", "kk", {"names": ["Alice"], "solution": [True]})
    ] * 4
    losses = supervised_warmup(
        m, tok, [tok(r.prompt).input_ids for r in rows], rows, WarmupConfig(steps=30, lr=1e-2, batch_size=4), 0, 2
    )
    assert len(losses) == 30 and losses[-1] < losses[0] * 0.5


def test_checkpoint_round_trip_and_partial_save_ignored(tok, tmp_path):
    m = build_tiny_model(TINY, tok, seed=0)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    state = ckpt.TrainerState(step=5, data_position=40, sampler={"history": {}}, rng=ckpt.capture_rng())
    record = {"config": {}, "data": {"train": {"rows": 0, "sha256": ""}, "eval": {"rows": 0, "sha256": ""}}}
    ckpt.save_checkpoint(tmp_path, m, opt, tok, state, record)
    (ckpt.checkpoint_dir(tmp_path) / "step_000009.tmp").mkdir()
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000005"
    expected = torch.rand(3)
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(str(ckpt.latest_checkpoint(tmp_path)), dtype=torch.float32)
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-3)
    loaded = ckpt.load_trainer_state(ckpt.latest_checkpoint(tmp_path), opt2)
    assert loaded.step == 5 and loaded.data_position == 40
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), other.state_dict().values(), strict=True))
    assert opt2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    ckpt.restore_rng(loaded.rng)
    assert torch.equal(torch.rand(3), expected)


def test_lora_wraps_and_rejects_unknown_modules(tok):
    m = build_tiny_model(TINY, tok, seed=0)
    wrapped = apply_lora(m, ModelConfig(lora_rank=4, lora_target_modules=["q_proj", "v_proj"]))
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with pytest.raises(ConfigError, match="lora_target_modules"):
        apply_lora(build_tiny_model(TINY, tok, seed=0), ModelConfig(lora_rank=4, lora_target_modules=["nope_proj"]))


def test_duplicates_are_reported_and_held_out_prompts_never_train(tmp_path, caplog):
    label = "(1) Alice is a knight"
    rows = [{"prompt": f"{p}: is Alice a knight?", "label": label} for p in ("A", "B", "C", "D", "A")]
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, held = load_run_rows(DataConfig(task="kk", train_path=str(train_file), num_eval=2), seed=0)
    # "A" (line 1) is held out too
    assert [r.prompt[0] for r in held] == ["D", "A"] and [r.prompt[0] for r in train] == [
        "B",
        "C",
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "adora_openrlhf.rows"]
    assert any(
        w.startswith(f"{train_file}:5: duplicate row (same prompt, images and label as {train_file}:1)")
        for w in warnings
    ), warnings
    caplog.clear()
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(
        "".join(json.dumps({"prompt": f"{p}: is Alice a knight?", "label": label}) + "\n" for p in ("B", "E"))
    )
    train, held = load_run_rows(DataConfig(task="kk", train_path=str(train_file), eval_path=str(eval_file)), seed=0)
    assert [r.prompt[0] for r in held] == ["E"] and len(train) == 5
    assert "data.eval_path: dropped 1 held-out rows that are also training rows (same prompt and images)" in caplog.text
    eval_file.write_text(json.dumps({"prompt": "C: is Alice a knight?", "label": label}) + "\n")
    with pytest.raises(ConfigError, match="data.eval_path: every held-out row is also a training row"):
        load_run_rows(DataConfig(task="kk", train_path=str(train_file), eval_path=str(eval_file)), seed=0)


def test_impossible_generation_request_names_the_option(monkeypatch):
    from adora_openrlhf.tasks import kk

    def too_many(num_train, num_eval, people, seed, **kwargs):
        raise ValueError(f"num: only 12 distinct puzzles found for people counts {list(people)}; ask for fewer")

    monkeypatch.setattr(kk, "generate_splits", too_many)
    with pytest.raises(
        ConfigError, match=r"^data.num_train: cannot generate 50 \+ 5 puzzles for kk.num_people \[2\] \(num: only 12"
    ):
        load_run_rows(DataConfig(num_train=50, num_eval=5, kk=KKDataConfig(num_people=[2])), seed=0)


@pytest.mark.parametrize("greedy", [True, False])
def test_generate_gives_the_same_tokens_as_the_default_cache(tok, model, greedy):
    prompts = [
        tok.encode(text) for text in ["Alice says", "Knights always tell the truth. Alice", "Bob is a knave."]
    ] * 3
    params = SamplingParams(temperature=1.0, max_new_tokens=2 * MIN_CAPACITY + 5)  # the buffer grows twice
    outputs = {}
    for kv_cache in ("growing", "dynamic"):
        torch.manual_seed(7)
        outputs[kv_cache] = generate_responses(
            model, tok, prompts, params, batch_size=4, greedy=greedy, kv_cache=kv_cache
        )
    assert outputs["growing"] == outputs["dynamic"]
    assert max(len(ids) for ids, _ in outputs["growing"]) > MIN_CAPACITY


def test_growing_kv_cache_covers_full_attention_models_only(model):
    class Sliding:
        class config:
            layer_types = ["full_attention", "sliding_attention"]

            @classmethod
            def get_text_config(cls, decoder=True):
                return cls

    assert growing_cache_for(Sliding()) is None
    assert growing_cache_for(model) is not None


def test_adora_correctness_follows_the_threshold_not_the_task_flag():
    """The local trainer leaves ``correct`` to the pipeline (reward > adora.correct_threshold), as the openrlhf
    backend does, so that a threshold a user sets decides which responses count as correct."""
    from adora_openrlhf.algorithms.pipeline import compute_ragged_step_advantages
    from adora_openrlhf.algorithms.sampling import PromptGroup, ScoredResponse
    from adora_openrlhf.backends.local.rl_step import group_batch
    from adora_openrlhf.config import AdoraConfig, AdvantageConfig
    from adora_openrlhf.engine.rollout import RolloutSample

    def response(reward, length, task_flag):
        return ScoredResponse(
            reward, reward > 0.5, length, payload=RolloutSample(0, [1], [2] * length, "x", task_flag, {})
        )

    # rewards 3, 1, 0 with lengths 4, 10, 6; the task flags the first two correct
    group = PromptGroup(
        0, [response(3.0, 4, True), response(1.0, 10, True), response(0.0, 6, False)], [3.0, 1.0, 0.0], None
    )
    batch = group_batch([group])
    assert (
        batch.correct is None
        and batch.rewards.tolist() == [3.0, 1.0, 0.0]
        and batch.lengths.tolist() == [4.0, 10.0, 6.0]
    )

    def weight(threshold):
        adora = AdoraConfig(enabled=True, correct_threshold=threshold, lambda_att=0.1)
        return compute_ragged_step_advantages(batch, [3], AdvantageConfig(), adora).weights.tolist()

    assert weight(0.5) == pytest.approx([1.0])  # correct {4, 10}, incorrect {6}: max_pos 10 > mean_neg 6
    assert weight(1.0) == pytest.approx([0.1])  # correct {4}, incorrect {10, 6}: max_pos 4 <= mean_neg 8


@pytest.mark.parametrize("recipe", ["kk-testbed", "kk-tiny"])
def test_shipped_kk_reward_flag_agrees_with_the_recipe_threshold(recipe):
    """On the shipped K&K reward the task's flag and reward > the recipe's threshold agree on every outcome."""
    import random

    from adora_openrlhf.recipes import build_run_config
    from adora_openrlhf.tasks import kk

    threshold = build_run_config(recipe).adora.correct_threshold
    puzzle = kk.generate_puzzle(2, random.Random(0), name_pool=3, name_order="pool")
    row = kk.kk_row(puzzle)
    wrong = [not role for role in puzzle.solution]
    responses = [
        kk.trace_response("guess.", puzzle.names, puzzle.solution),  # well formed, right
        kk.trace_response("guess.", puzzle.names, wrong),  # well formed, wrong
        kk.format_solution(puzzle.names, puzzle.solution),  # right answer, no tags
        "<think>guess.</think>",  # no answer block
    ]
    results = [kk_reward(text, row["label"], row["meta"]) for text in responses]
    assert [r.correct for r in results] == [True, False, False, False]
    assert [r.reward > threshold for r in results] == [r.correct for r in results]


def test_rollout_metrics_count_group_classes():
    """All-correct, all-wrong and mixed groups (the task's correctness): 1 of 3 each, hand-counted."""
    from adora_openrlhf.algorithms.sampling import PromptGroup, ScoredResponse
    from adora_openrlhf.backends.local.rl_step import rollout_metrics
    from adora_openrlhf.engine.rollout import RolloutSample

    def group(flags):
        kept = [
            ScoredResponse(
                3.0 if f else -0.5,
                f,
                4,
                payload=RolloutSample(0, [1], [2] * 4, "<think>guess.</think>", f, {"format_ok": 1.0}),
            )
            for f in flags
        ]
        return PromptGroup(0, kept, [r.reward for r in kept], None)

    rows = [Row(prompt="p", label="l", source="kk", meta={})]
    metrics = rollout_metrics([group([True, True]), group([False, False]), group([True, False])], rows)
    assert (
        metrics["groups/all_correct_fraction"]
        == metrics["groups/all_wrong_fraction"]
        == metrics["groups/mixed_fraction"]
        == pytest.approx(1 / 3)
    )
    assert metrics["reward/accuracy"] == 0.5 and metrics["response/shortcut_fraction"] == 1.0


def test_evaluation_reports_accuracy_per_people_count(monkeypatch):
    """Held-out accuracy per subset of eval.benchmarks (K&K: ppl=N); a subset holding every row (ID) is not repeated."""
    import adora_openrlhf.engine.evaluate as evaluate_module
    from adora_openrlhf.tasks.kk import generate_rows

    raw = generate_rows(3, [2], seed=0) + generate_rows(2, [3], seed=0)
    rows = validate_rows(raw, "eval", "kk")
    # hand-made responses: the right answer for the 2-person puzzles and the first 3-person one, a wrong one for the last
    texts = [f"<think>x</think>\n<answer>{r.label}</answer>" for r in rows[:4]] + [
        "<think>x</think>\n<answer>none</answer>"
    ]

    def decoded_indices(model, tok, prompts, *args, **kwargs):
        return [([i], False) for i in range(len(prompts))]

    monkeypatch.setattr("adora_openrlhf.engine.rollout.generate_responses", decoded_indices)

    class Decoder:
        def decode(self, ids, skip_special_tokens=True):
            return texts[ids[0]]

    metrics = evaluate_module.evaluate(
        None,
        Decoder(),
        [[1]] * 5,
        rows,
        make_reward_fns(rows),
        SamplingParams(),
        samples=0,
        settings=GenerationSettings(8),
    )
    assert metrics["eval/greedy_accuracy"] == pytest.approx(4 / 5)
    assert metrics["eval/greedy_accuracy/ppl_2"] == pytest.approx(1.0)
    assert metrics["eval/greedy_accuracy/ppl_3"] == pytest.approx(1 / 2)
    assert not any(key.endswith("/ID") for key in metrics)


def test_saved_tokenizer_loads_back_with_the_same_token_ids(tmp_path):
    """A checkpoint directory holds a Qwen2 config.json, so AutoTokenizer loads the run's tokenizer as a
    Qwen2Tokenizer, which rebuilds its own normaliser and pre-tokeniser: the trained tokenizer must use the same
    ones, or a resumed run, a warm start or eval.run would see other token ids than training did (digits above all)."""
    from adora_openrlhf.engine.tokenization import load_tokenizer
    from adora_openrlhf.tasks.kk import generate_rows, statements_from_json, thorough_response

    rows = generate_rows(20, [2, 3], seed=0)
    texts = [r["prompt"][-1]["content"] for r in rows] + [
        thorough_response(r["meta"]["names"], statements_from_json(r["meta"]["statements"])) for r in rows
    ]
    trained = train_bpe_tokenizer(texts, 400)
    build_tiny_model(TINY, trained, seed=0).save_pretrained(str(tmp_path))
    trained.save_pretrained(str(tmp_path))
    loaded = load_tokenizer(str(tmp_path))
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    for text in [*texts, "try 12: 2 inhabitants (10) Zoë\n<think>x</think>\n<answer>(1) A</answer><|endoftext|>"]:
        ids = trained(text, add_special_tokens=False)["input_ids"]
        assert loaded(text, add_special_tokens=False)["input_ids"] == ids
        assert loaded.decode(ids, skip_special_tokens=True) == trained.decode(ids, skip_special_tokens=True)


def test_majority_accuracy_hand_case():
    """Per (kind, level): colour L1 training labels red x2, blue x1 -> red; colour L2: blue. Held-out: L1 red (right),
    L1 green (wrong), L2 blue (right), L3 (no training row there: overall majority, red x2 vs blue x2, first seen red) red."""
    from adora_openrlhf.engine.evaluate import majority_accuracy

    def row(label, level):
        return Row(prompt=f"q{level}", label=label, source="geo_synth", meta={"task": "colour", "difficulty": level})

    train = [row("red", 1), row("blue", 1), row("red ", 1), row("blue", 2)]
    held = [row("red", 1), row("green", 1), row("blue", 2), row("red", 3)]
    assert majority_accuracy(train, held) == 3 / 4
    assert majority_accuracy(train, []) == 0.0 and majority_accuracy([], held) == 0.0
    texts = [Row(prompt="p", label=lab, source="math", meta={}) for lab in ("1", "1", "2")]  # no subsets: one group
    assert majority_accuracy(texts, texts) == 2 / 3
