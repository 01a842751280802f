"""bench.trl_testbed's bookkeeping on hand-made records (the benchmark itself is run by hand, not in CI)."""

import pytest

from bench.trl_testbed import PLAN, adora_fields, main, table


def _record(trainer, variant, seed, acc0, acc40, step_s=2.0, responses=5120):
    return {
        "trainer": trainer,
        "variant": variant,
        "seed": seed,
        "acc_step0": acc0,
        "acc_final": acc40,
        "step_s": step_s,
        "responses": responses,
    }


def test_variants_become_the_drop_ins_prefixed_fields():
    assert adora_fields("GRPO") == {}
    assert adora_fields("GRPO+ADORA") == {"adora_enabled": True, "adora_mode": "attenuate", "adora_edge_policy": "llm"}
    assert adora_fields("Ada-balance") == {
        "sampling_enabled": True,
        "sampling_samples_per_round": 8,
        "sampling_max_rounds": 2,
        "sampling_exit_rule": "balance",
    }


def test_every_planned_drop_in_variant_builds_an_adora_grpo_config(tmp_path):
    pytest.importorskip("trl")
    from adora_openrlhf.integrations.trl import AdoraGRPOConfig

    for trainer_kind, variant in PLAN:
        if trainer_kind == "adora-trl":
            args = AdoraGRPOConfig(
                output_dir=str(tmp_path),
                use_cpu=True,
                num_generations=8,
                correct_threshold=1.0,
                **adora_fields(variant),
            )
            assert args.adora_config().enabled == (variant == "GRPO+ADORA")
            assert args.sampling_config().enabled == (variant == "Ada-balance")


def test_table_gains_per_seed_and_their_mean_hand_computed():
    """seeds 0 and 1: gains +0.100 and +0.300 -> mean +0.200; half-width t(0.975, 1) * sd / sqrt(2) with sd = sqrt(0.02):
    12.706 * 0.141421 / 1.414214 = 1.271."""
    records = [_record("trl", "GRPO", 0, 0.2, 0.3, step_s=2.0), _record("trl", "GRPO", 1, 0.1, 0.4, step_s=4.0)]
    rows = [line for line in table(records).splitlines() if line.startswith("| trl")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:7] == ["trl", "GRPO", "0 1", "0.200 0.100", "0.300 0.400", "+0.100 +0.300", "+0.200 ± 1.271"]
    assert cells[7:] == ["3.0", "5120"]


def test_runs_the_benchmark_does_not_make_are_one_error(capsys):
    with pytest.raises(SystemExit):
        main(["--runs", "trl:GRPO+ADORA"])
    assert "--runs: trl:GRPO+ADORA is not a run this benchmark makes" in capsys.readouterr().err


def test_compact_generate_returns_what_model_generate_returns_greedy_and_sampled():
    """Greedy: the same tokens as transformers' generate, padded after eos; sampled: prompt kept, eos or limit."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from bench.trl_testbed import use_compact_decoding

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12], [0, 13, 14, 15, 16]])
    mask = (torch.arange(5)[None] >= torch.tensor([[2], [0], [1]])).long()
    greedy = GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=3, pad_token_id=0)
    want = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)
    compact = Qwen2ForCausalLM(config).eval()
    compact.load_state_dict(model.state_dict())
    use_compact_decoding(compact, pad_token_id=0)
    got = compact.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)
    assert torch.equal(got, want[:, : got.shape[1]]) and bool((want[:, got.shape[1] :] == 0).all())
    assert compact.training is False
    sampled = GenerationConfig(
        do_sample=True, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=9, eos_token_id=[3], pad_token_id=0
    )
    compact.train()
    out = compact.generate(input_ids=ids, attention_mask=mask, generation_config=sampled)
    assert compact.training is True  # restored
    assert torch.equal(out[:, :5], ids) and out.shape[1] <= 5 + 9
    for row in out[:, 5:].tolist():
        body = row[: row.index(3) + 1] if 3 in row else row
        assert len(body) <= 9 and all(t == 0 for t in row[len(body) :])
    with pytest.raises(TypeError, match="unexpected arguments"):
        compact.generate(input_ids=ids, attention_mask=mask, generation_config=greedy, pixel_values=None)
