"""AdoraGRPOTrainer against the real TRL (trl 1.16.0) on CPU, with a tiny random-init model.

What the loss receives, what the sampler counted, what was generated and with which parameters, and the config's
fields and errors. Every trainer here trains a 1-layer model on 2-4 prompts with 8-token completions.
"""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from adora_openrlhf.algorithms.pipeline import GroupBatch, compute_step_advantages  # noqa: E402
from adora_openrlhf.config import AdoraConfig, AdvantageConfig, ConfigError, TinyModelConfig  # noqa: E402
from adora_openrlhf.engine.model import build_tiny_model  # noqa: E402
from adora_openrlhf.engine.tokenization import train_bpe_tokenizer  # noqa: E402
from adora_openrlhf.integrations.trl import AdoraGRPOConfig, AdoraGRPOTrainer  # noqa: E402

PROMPTS = [f"question {i}: add {i} and {i + 1}" for i in range(40)]


@functools.cache
def _tokenizer():
    return train_bpe_tokenizer(PROMPTS, 300)


def _model():
    tiny = TinyModelConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return build_tiny_model(tiny, _tokenizer(), 0)


def _data(count: int = 40):
    return datasets.Dataset.from_list([{"prompt": p, "label": str(i)} for i, p in enumerate(PROMPTS[:count])])


class RecordingReward:
    """A reward of 0, 1 or 2 from the completion's token ids; records every completion it scores, per step."""

    __name__ = "token_sum_mod3"

    def __init__(self):
        self.calls: list[tuple[int, list[list[int]], list[float]]] = []  # (global step, completion ids, rewards)

    def __call__(self, prompts, completions, completion_ids, trainer_state=None, **_):
        rewards = [float(sum(ids) % 3) for ids in completion_ids]
        self.calls.append((trainer_state.global_step, [list(ids) for ids in completion_ids], rewards))
        return rewards


def _trainer(
    tmp_path, reward=None, steps: int = 2, prompts_per_step: int = 2, n: int = 4, **fields
) -> tuple[AdoraGRPOTrainer, RecordingReward]:
    reward = reward or RecordingReward()
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=prompts_per_step * n,
        num_generations=n,
        max_completion_length=8,
        max_steps=steps,
        learning_rate=1e-2,
        beta=0.0,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    args = AdoraGRPOConfig(**{**defaults, **fields})
    trainer = AdoraGRPOTrainer(
        model=_model(), reward_funcs=reward, args=args, train_dataset=_data(), processing_class=_tokenizer()
    )
    return trainer, reward


def _capture(trainer):
    """Record every batch TRL's pipeline hands on (before its shuffle) and every batch the loss receives."""
    produced, received = [], []
    make, loss = trainer._generate_and_score_completions, trainer._compute_loss

    def make_spy(inputs):
        out = make(inputs)
        produced.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()})
        return out

    def loss_spy(model, inputs):
        received.append(
            {k: inputs[k].clone() for k in ("prompt_ids", "completion_ids", "completion_mask", "advantages")}
        )
        return loss(model, inputs)

    trainer._generate_and_score_completions, trainer._compute_loss = make_spy, loss_spy
    return produced, received


def _rows(batch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(prompt ids, completion ids) of every row of a batch, padding removed."""
    out = []
    for p, c, m in zip(batch["prompt_ids"], batch["completion_ids"], batch["completion_mask"], strict=True):
        out.append((tuple(int(t) for t in p if t != _tokenizer().pad_token_id), tuple(int(t) for t in c[m.bool()])))
    return out


def test_the_loss_receives_the_cores_advantages_on_the_same_rewards_and_lengths(tmp_path):
    fields = dict(adora_enabled=True, adora_edge_policy="llm", correct_threshold=0.5)
    trainer, reward = _trainer(tmp_path, steps=2, **fields)
    produced, received = _capture(trainer)
    trainer.train()
    assert len(produced) == 2 and len(reward.calls) == 2
    eos = {*trainer.eos_token_ids, _tokenizer().pad_token_id}
    for batch, (_, ids, rewards) in zip(produced, reward.calls, strict=True):
        lengths = batch["completion_mask"].sum(1)
        assert lengths.tolist() == [len(x) for x in ids]
        truncated = torch.tensor([x[-1] not in eos for x in ids])
        expected = compute_step_advantages(
            GroupBatch(
                rewards=torch.tensor(rewards).view(-1, 4),
                lengths=lengths.float().view(-1, 4),
                truncated=truncated.view(-1, 4),
            ),
            AdvantageConfig(estimator="group_norm", eps=1e-4),
            AdoraConfig(enabled=True, edge_policy="llm", correct_threshold=0.5),
        ).advantages.reshape(-1)
        assert torch.equal(batch["advantages"], expected)
    # the loss gets exactly these values, row by row (TRL shuffles the rows before the loss)
    for batch, seen in zip(produced, received, strict=True):
        by_row = dict(zip(_rows(batch), batch["advantages"].tolist(), strict=True))
        assert [by_row[r] for r in _rows(seen)] == seen["advantages"].tolist()


def test_with_everything_off_the_advantages_are_trls_except_uniform_groups_are_exactly_zero(tmp_path):
    trainer, reward = _trainer(tmp_path, steps=3)
    produced, _ = _capture(trainer)
    trainer.train()
    for batch, (_, _, rewards) in zip(produced, reward.calls, strict=True):
        r = torch.tensor(rewards).view(-1, 4)
        trl_formula = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(-1)
        uniform = (r.max(1).values == r.min(1).values).repeat_interleave(4)
        assert torch.allclose(batch["advantages"], torch.where(uniform, 0.0, trl_formula), atol=1e-6)
        assert bool((batch["advantages"][uniform] == 0).all())


def test_core_advantages_by_hand_with_weighted_reward_functions(tmp_path):
    """Two reward functions with reward_weights [1, 0.5]; one group of 4 per prompt, ADORA length rule, attenuate.

    group 0: rewards 1*r1 + 0.5*r2 = [3, -0.5, 3, -0.5], lengths [100, 50, 80, 60]: max correct length 100 > mean
    incorrect 55 -> TAS, weight 1; mean 1.25, std sqrt(4 * 1.75^2 / 3) = 2.0207, A = +-1.75 / (2.0207 + 1e-4).
    group 1: rewards [2, 0, 0, 0], lengths [40, 90, 100, 80]: 40 < 90 -> TDS, weight 0.1; mean 0.5, std 1,
    A = 0.1 * [1.5, -0.5, -0.5, -0.5] / (1 + 1e-4).
    """
    trainer, _ = _trainer(
        tmp_path,
        reward=[RecordingReward(), RecordingReward()],
        reward_weights=[1.0, 0.5],
        adora_enabled=True,
        correct_threshold=1.0,
    )
    per_func = torch.tensor(
        [[2.0, 2.0], [-1.0, 1.0], [3.0, 0.0], [0.0, -1.0], [1.0, 2.0], [0.0, 0.0], [-1.0, 2.0], [0.0, 0.0]]
    )
    lengths = torch.tensor([100, 50, 80, 60, 40, 90, 100, 80])
    out = trainer.core_advantages(per_func, lengths, torch.zeros(8, dtype=torch.bool), group_size=4)
    std0 = math.sqrt(4 * 1.75**2 / 3)
    expected = [1.75 / (std0 + 1e-4), -1.75 / (std0 + 1e-4)] * 2 + [
        0.1 * a / (1 + 1e-4) for a in (1.5, -0.5, -0.5, -0.5)
    ]
    assert out.advantages.reshape(-1).tolist() == pytest.approx(expected, rel=1e-6)
    assert out.adora.group_class.tolist() == [1, -1]
    assert out.metrics["adora/tas_fraction"] == 0.5


@functools.cache
def _shared_trainer(adora: bool):
    import tempfile
    from pathlib import Path

    return _trainer(Path(tempfile.mkdtemp()), adora_enabled=adora, correct_threshold=0.5)[0]


@settings(max_examples=30)
@given(
    rewards=st.lists(st.sampled_from([0.0, 1.0, 2.0, -1.0]), min_size=8, max_size=8),
    lengths=st.lists(st.integers(1, 50), min_size=8, max_size=8),
)
def test_attenuation_keeps_signs_and_never_grows_an_advantage(rewards, lengths):
    per_func, length = torch.tensor(rewards).unsqueeze(1), torch.tensor(lengths)
    truncated = torch.zeros(8, dtype=torch.bool)
    plain = _shared_trainer(False).core_advantages(per_func, length, truncated, 4).advantages
    weighted = _shared_trainer(True).core_advantages(per_func, length, truncated, 4).advantages
    assert bool((torch.sign(plain) == torch.sign(weighted)).all())
    assert bool((weighted.abs() <= plain.abs()).all())
    for p, w in zip(plain, weighted, strict=True):  # per group: every advantage x 1 or every one x lambda_att (0.1)
        nonzero = p != 0
        assert torch.allclose(w[nonzero], p[nonzero]) or torch.allclose(w[nonzero], 0.1 * p[nonzero])


def test_ten_steps_of_adora_with_adaptive_sampling_change_the_weights_and_log_the_metrics(tmp_path):
    trainer, _ = _trainer(
        tmp_path,
        steps=10,
        adora_enabled=True,
        sampling_enabled=True,
        sampling_exit_rule="balance",
        sampling_samples_per_round=4,
        sampling_max_rounds=3,
        sampling_escalation='[{"temperature": 1.5}]',
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) >= len(before) // 2
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 10
    for h in steps:
        for key in (
            "adora/tas_fraction",
            "adora/mean_weight",
            "advantage/zero_signal_fraction",
            "sampling/responses_generated",
            "sampling/rounds_used",
        ):
            assert key in h and math.isfinite(h[key])


def test_generation_count_per_step_matches_the_samplers_bookkeeping_and_later_rounds_are_escalated(
    tmp_path, monkeypatch
):
    trainer, reward = _trainer(
        tmp_path,
        steps=4,
        sampling_enabled=True,
        sampling_exit_rule="pos",
        correct_threshold=1.5,  # positive: reward 2 of {0, 1, 2}
        sampling_samples_per_round=2,
        sampling_max_rounds=3,
        sampling_escalation=[{"temperature": 1.7, "top_p": 0.9}],
    )
    generated, settings = {}, []
    original = trl.GRPOTrainer._generate

    def spy(self, prompts):
        generated[self.state.global_step] = generated.get(self.state.global_step, 0) + len(prompts)
        settings.append((len(prompts), self.generation_config.temperature, self.generation_config.top_p))
        return original(self, prompts)

    monkeypatch.setattr(trl.GRPOTrainer, "_generate", spy)
    trainer.train()
    scored: dict[int, int] = {}
    for step, ids, _ in reward.calls:
        scored[step] = scored.get(step, 0) + len(ids)
    logged = [
        int(h["sampling/responses_generated"]) for h in trainer.state.log_history if "sampling/responses_generated" in h
    ]
    assert [generated[s] for s in range(4)] == [scored[s] for s in range(4)] == logged
    assert all(n >= 2 * 4 for n in logged)  # at least n_keep per prompt
    rounds = [h["sampling/rounds_used"] for h in trainer.state.log_history if "sampling/rounds_used" in h]
    assert sum(rounds) > 4, "no step used a second round: the test does not see the escalation"
    assert {(t, p) for _, t, p in settings} == {(1.0, 1.0), (1.7, 0.9)}
    assert trainer.generation_config.temperature == 1.0 and trainer.generation_config.top_p == 1.0  # restored


def test_dynamic_filtering_trains_only_on_mixed_groups_and_refills_from_the_dataset(tmp_path):
    trainer, _ = _trainer(
        tmp_path,
        steps=4,
        prompts_per_step=2,
        dynamic_filtering_enabled=True,
        correct_threshold=0.5,
        dynamic_filtering_max_refills=6,
    )
    seen = []
    original = trainer.core_advantages

    def spy(rewards_per_func, lengths, truncated, group_size, pool_stats=None):
        seen.append(rewards_per_func.view(-1, group_size))
        return original(rewards_per_func, lengths, truncated, group_size, pool_stats)

    trainer.core_advantages = spy
    trainer.train()
    logs = [h for h in trainer.state.log_history if "filter/kept_groups" in h]
    assert len(logs) == 4
    for rewards, h in zip(seen, logs, strict=True):
        if h["sampling/empty_step"]:
            continue
        correct = (rewards > 0.5).float().mean(1)
        assert bool(((correct > 0) & (correct < 1)).all())
        assert h["filter/prompts_consumed"] >= h["filter/kept_groups"] == rewards.shape[0]


def test_difficulty_allocation_picks_among_extra_candidates_and_its_store_resumes(tmp_path):
    """allocation_method difficulty, 2 candidates per prompt: each step examines 4 prompts (TRL's 2 and 2 drawn from
    train_dataset) and samples 2 of them, num_generations each; the store learns one observation per sampled group,
    is saved in every checkpoint and restored when training resumes from one."""
    fields = dict(
        allocation_method="difficulty",
        allocation_candidates=2.0,
        correct_threshold=0.5,
        save_strategy="steps",
        save_steps=1,
    )
    trainer, _ = _trainer(tmp_path, steps=3, **fields)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "allocation/candidates" in h]
    assert [(h["allocation/candidates"], h["allocation/prompts_sampled"]) for h in logs] == [(4.0, 2.0)] * 3

    def observations(state):
        return sum(n for *_, n in state["posteriors"])

    saved = json.loads((tmp_path / "out" / "checkpoint-3" / "adora_allocation_state.json").read_text())
    assert saved == trainer._allocator.state_dict() and observations(saved) == 6

    resumed, _ = _trainer(tmp_path, steps=4, **fields)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-3"))
    assert observations(resumed._allocator.state_dict()) == 8  # step 3's store, plus step 4's two groups


def test_config_fields_carry_help_and_bad_values_name_the_field(tmp_path):
    import dataclasses

    new = [
        f
        for f in dataclasses.fields(AdoraGRPOConfig)
        if f.name not in {g.name for g in dataclasses.fields(trl.GRPOConfig)}
    ]
    assert len(new) >= 25 and all(f.metadata.get("help") for f in new)
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True, report_to=[])
    cases = {
        "adora_lambda_att": dict(adora_lambda_att=0.0),
        "adora_rule": dict(adora_rule="nope"),
        "sampling_exit_rule": dict(sampling_exit_rule="nope"),
        "sampling_escalation[0]": dict(sampling_escalation=[{"temperature": -1}]),
        "sampling_escalation: not valid JSON": dict(sampling_escalation="[{"),
        "sampling_max_responses_per_prompt": dict(
            sampling_enabled=True, sampling_max_rounds=1, sampling_samples_per_round=2
        ),
        "dynamic_filtering_score_range": dict(dynamic_filtering_score_range=[1.0, 0.0]),
        "dynamic_filtering_enabled": dict(dynamic_filtering_enabled=True, sampling_enabled=True),
        "scale_rewards": dict(scale_rewards="batch"),
        "allocation_method: 'knapsack'": dict(allocation_method="knapsack"),
        "allocation_candidates": dict(allocation_candidates=0.5),
        "advantage_estimator": dict(advantage_estimator="nope"),
        "advantage_estimator: 'gae' is not available in AdoraGRPOTrainer": dict(advantage_estimator="gae"),
        "top_p": dict(sampling_enabled=True, top_p=0.0),
        "max_completion_length": dict(max_completion_length=0),  # the core's rollout.max_new_tokens
        # passed into the ADORA config, named as this config's field
        "correct_threshold": dict(correct_threshold="0.5"),
        "sampling_positive_threshold": dict(sampling_positive_threshold="high"),
    }
    for name, fields in cases.items():
        with pytest.raises(ConfigError, match=f"^{name.replace('[', '.').replace(']', '.')}"):
            AdoraGRPOConfig(**base, **fields)
    with pytest.raises(ConfigError, match="^args: AdoraGRPOTrainer needs an AdoraGRPOConfig"):
        AdoraGRPOTrainer(
            model=_model(),
            reward_funcs=RecordingReward(),
            args=trl.GRPOConfig(**base),
            train_dataset=_data(),
            processing_class=_tokenizer(),
        )


def test_the_config_parses_from_the_command_line(tmp_path):
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(AdoraGRPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--use_cpu",
            "true",
        ]
        + [
            "--adora_enabled",
            "true",
            "--adora_mode",
            "amplify",
            "--sampling_enabled",
            "true",
            "--sampling_escalation",
            '[{"temperature": 1.2}]',
        ]
        + ["--dynamic_filtering_score_range", "0.1", "0.9", "--correct_threshold", "1.0"]
    )
    assert args.adora_config().mode == "amplify" and args.adora_config().correct_threshold == 1.0
    assert args.sampling_config().escalation == [{"temperature": 1.2}] and args.sampling_config().n_keep == 4
    assert args.filtering_config().score_range == [0.1, 0.9]
    assert args.advantage_config().estimator == "group_norm" and args.advantage_config().eps == 1e-4
