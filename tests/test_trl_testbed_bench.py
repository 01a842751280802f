"""bench.trl_testbed's bookkeeping on hand-made records (the benchmark itself is run by hand, not in CI)."""

import pytest

from bench.trl_testbed import PLAN, adora_fields, main, table


def _record(trainer, variant, seed, acc0, acc40, step_s=2.0, responses=5120):
    return {"trainer": trainer, "variant": variant, "seed": seed, "acc_step0": acc0, "acc_final": acc40, "step_s": step_s, "responses": responses}


def test_variants_become_the_drop_ins_prefixed_fields():
    assert adora_fields("GRPO") == {}
    assert adora_fields("GRPO+ADORA") == {"adora_enabled": True, "adora_mode": "attenuate", "adora_edge_policy": "llm"}
    assert adora_fields("Ada-balance") == {"sampling_enabled": True, "sampling_samples_per_round": 8, "sampling_max_rounds": 2, "sampling_exit_rule": "balance"}


def test_every_planned_drop_in_variant_builds_an_adora_grpo_config(tmp_path):
    pytest.importorskip("trl")
    from adora_openrlhf.integrations.trl import AdoraGRPOConfig

    for trainer_kind, variant in PLAN:
        if trainer_kind == "adora-trl":
            args = AdoraGRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=8, correct_threshold=1.0, **adora_fields(variant))
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
