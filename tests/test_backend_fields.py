"""One config, honoured everywhere: every RunConfig field is mapped, used or refused by each backend, by name."""

from __future__ import annotations

import pathlib

import pytest

from adora_openrlhf.backends.support import BACKEND_FIELDS, MAPPED, USED, Refused, check_backend_fields
from adora_openrlhf.cli_args import LEAF_TYPES
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.recipes import RECIPES, build_run_config

BASE = "dapo-math-adora"  # a cluster recipe with model.path, train and eval files


def _cfg(backend: str, overrides: dict) -> RunConfig:
    """BASE with ``overrides``, on ``backend``, adaptive sampling off and no recipe flags (``extra`` as given)."""
    values = build_run_config(BASE, {"sampling.enabled": False, **overrides}).to_dict()
    values.update(backend=backend, extra=overrides.get("extra", {}))
    return RunConfig.from_dict(values)


# a valid value other than BASE's for every field the openrlhf backend maps to an OpenRLHF flag
MAPPED_VALUES = {
    "seed": 7,
    "steps": 3,
    "prompts_per_step": 16,
    "output_dir": "runs/elsewhere",
    "save_every": 3,
    "eval_every": 3,
    "eval_samples": 4,
    "rollout.temperature": 0.7,
    "rollout.top_p": 0.9,
    "rollout.max_new_tokens": 64,
    "advantage.estimator": "rloo",
    "sampling.n_keep": 6,
    "model.path": "owner/other",
    "model.lora_rank": 8,
    "model.lora_alpha": 32,
    "model.freeze_visual_encoder": True,
    "model.lora_target_modules": ["q_proj"],
    "model.dtype": "float16",
    "data.train_path": "other.jsonl",
    "data.eval_path": "other_eval.jsonl",
    "data.max_prompt_tokens": 256,
    "train.lr": 3e-6,
    "train.lr_scheduler": "cosine",
    "train.lr_warmup_ratio": 0.05,
    "train.min_lr_ratio": 0.2,
    "train.weight_decay": 0.01,
    "train.clip_eps_low": 0.1,
    "train.clip_eps_high": 0.3,
    "train.kl_coef": 0.01,
    "train.max_grad_norm": 0.5,
    "train.ppo_epochs": 2,
    "train.micro_batch_size": 4,
    "train.loss_agg": "seq_mean_token_mean",
    "dynamic_filtering.enabled": True,
    "dynamic_filtering.score_range": [0.1, 0.9],
    "advantage.gamma": 0.9,
    "advantage.lambd": 0.95,
    "critic.lr": 1e-4,
    "critic.weight_decay": 0.01,
    "critic.max_grad_norm": 2.0,
    "critic.value_clip": 0.2,
}
GAE = {"advantage.estimator": "gae"}
# fields whose flag is emitted only under another field's value: both command lines are built with it
MAPPED_WHEN = {
    "dynamic_filtering.score_range": {"dynamic_filtering.enabled": True},
    "model.freeze_visual_encoder": {"data.task": "geometry"},
    **{name: GAE for name in ("advantage.gamma", "advantage.lambd")},  # token estimators only (lambd: gae)
    **{f"critic.{name}": GAE for name in ("lr", "weight_decay", "max_grad_norm", "value_clip")},  # gae only
}

# a value each backend refuses (with adaptive sampling off)
REFUSED_VALUES = {
    "rollout.min_p": 0.05,
    "rollout.repetition_penalty": 1.1,
    "model.generation_batch_size": 8,
    "model.kv_cache": "dynamic",
    "model.decoding": "generate",
    "model.numerics": "fast",
    "model.init_kwargs": {"revision": "v2"},
    "model.merge_lora_on_save": True,
    "data.prompt_template": "compact",
    "data.kk.num_people": [3],
    "data.kk.name_pool": 5,
    "data.kk.name_order": "pool",
    "data.num_train": 10,
    "data.num_eval": 5,
    "data.geo.tasks": ["count"],
    "data.geo.levels": [1],
    "warmup.steps": 10,
    "warmup.lr": 0.01,
    "warmup.batch_size": 4,
    "warmup.style": "thorough",
    "warmup.mix_steps": 5,
    "warmup.mix_lr": 0.01,
    "warmup.mix": {"thorough": 1.0},
    "warmup.style_shares": {"thorough": 1.0},
    "warmup.lr_ramp": 0.1,
    "report_to": ["none"],
    "extra": {"openrlhf": {"vllm.num_engines": 2}},
    "max_missing_reward_fraction": 0.5,
    "critic.epochs": 2,
    "critic.warm_start": False,
    "dynamic_filtering.max_refills": 8,
    "data.rl_prompts": 64,
    "allocation.method": "skip",
    "allocation.candidates": 2.0,
    "allocation.budget": 0.5,
    "allocation.min_responses": 4,
    "allocation.max_responses": 8,
    "allocation.value": "information",
    "allocation.skip_threshold": 0.9,
    "allocation.explore": 0.2,
    "allocation.prior": [1.0, 1.0],
    "allocation.decay": 0.9,
    "allocation.max_prompts": 10,
    **{
        f"model.tiny.{k}": v
        for k, v in {
            "vocab_size": 600,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 512,
        }.items()
    },
    **{
        f"model.tiny_vision.{k}": v
        for k, v in {
            "image_size": 32,
            "patch_size": 4,
            "spatial_merge_size": 1,
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 1,
        }.items()
    },
}


@pytest.mark.parametrize("backend", sorted(BACKEND_FIELDS))
def test_every_config_field_is_mapped_used_or_refused(backend):
    """Walks every leaf of the RunConfig dataclasses: each one has an entry, and only known kinds of entries."""
    from adora_openrlhf.tasks.builtin import BUILTIN_TASKS
    from adora_openrlhf.tasks.registry import TASKS

    table = BACKEND_FIELDS[backend]
    # a plug-in task's options section (imported by another test of this process) is USED by default
    plugged = tuple(f"data.{t.section}." for t in TASKS.values() if t.options and t not in BUILTIN_TASKS)
    fields = {name for name in LEAF_TYPES if not name.startswith(plugged)} if plugged else set(LEAF_TYPES)
    assert sorted(fields - set(table)) == [], "fields with no entry"
    assert sorted(set(table) - fields) == [], "entries for fields that do not exist"
    assert all(entry in (MAPPED, USED) or isinstance(entry, Refused) for entry in table.values())


def test_mapped_fields_change_the_openrlhf_command_line():
    flags = pytest.importorskip("adora_openrlhf.backends.openrlhf.flags")
    mapped = sorted(d for d, entry in BACKEND_FIELDS["openrlhf"].items() if entry == MAPPED)
    assert sorted(MAPPED_VALUES) == mapped  # a newly mapped field needs a value here
    for dotted, value in MAPPED_VALUES.items():
        condition = MAPPED_WHEN.get(dotted, {})
        base = flags.build_argv(_cfg("openrlhf", condition))
        argv = flags.build_argv(_cfg("openrlhf", {**condition, dotted: value}))
        assert argv != base, dotted


@pytest.mark.parametrize("backend", sorted(BACKEND_FIELDS))
def test_refused_fields_are_errors_naming_field_and_backend(backend):
    refused = sorted(d for d, entry in BACKEND_FIELDS[backend].items() if isinstance(entry, Refused))
    assert set(refused) <= set(REFUSED_VALUES)
    check_backend_fields(_cfg(backend, {}))  # defaults pass
    for dotted in refused:
        overrides = {dotted: REFUSED_VALUES[dotted]}
        if dotted == "warmup.mix_steps":
            overrides["warmup.mix"] = {"thorough": 1.0}
        with pytest.raises(
            ConfigError, match=rf"^{dotted.replace('.', '[.]')}: not supported by the {backend} backend \(got "
        ):
            check_backend_fields(_cfg(backend, overrides))


def test_conditional_and_partial_refusals():
    def ok(**overrides):
        check_backend_fields(_cfg("openrlhf", overrides))

    # the sampler sends them to vLLM
    ok(**{"sampling.enabled": True, "rollout.min_p": 0.05, "rollout.repetition_penalty": 1.1})
    ok(**{"data.prompt_template": "chat"})
    ok(**{"model.init_kwargs": {"attn_implementation": "sdpa", "trust_remote_code": True}})
    with pytest.raises(ConfigError, match="model.init_kwargs: not supported by the openrlhf backend"):
        ok(**{"model.init_kwargs": {"trust_remote_code": False}})


def test_openrlhf_flags_of_the_table_are_openrlhfs_and_refusals_name_them():
    """Each entry of OPENRLHF_FLAGS is a flag of OpenRLHF 0.11.2's own parser; OpenRLHF's defaults pass; a refused
    value is an error naming the flag."""
    pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")
    from adora_openrlhf.backends.openrlhf.compat.entry import parse_openrlhf_args
    from adora_openrlhf.backends.support import OPENRLHF_FLAGS, check_openrlhf_flags
    from adora_openrlhf.dotted import value_at

    base = ["--actor.num_gpus_per_node", "1", "--rollout.n_samples_per_prompt", "2", "--reward.remote_url", "r.py"]
    defaults = parse_openrlhf_args(base)
    for dotted in OPENRLHF_FLAGS:
        group, _, name = dotted.rpartition(".")
        assert hasattr(value_at(defaults, group), name), dotted
    check_openrlhf_flags(defaults)
    corrected = ["--algo.advantage.is_correction_level", "token", "--algo.kl.unbiased_gradient"]
    check_openrlhf_flags(parse_openrlhf_args([*base, "--train.async_enable", *corrected]))
    with pytest.raises(ConfigError, match=r"^train[.]partial_rollout_enable: not supported by the openrlhf backend"):
        check_openrlhf_flags(parse_openrlhf_args([*base, "--train.async_enable", "--train.partial_rollout_enable"]))


def test_every_recipe_passes_its_own_backends_checks():
    for name, recipe in RECIPES.items():
        for backend in recipe.backends:
            check_backend_fields(build_run_config(name, {"backend": backend}))


def test_openrlhf_flags_of_shared_model_and_eval_fields():
    flags = pytest.importorskip("adora_openrlhf.backends.openrlhf.flags")
    derived = flags.derived_flags(
        build_run_config(
            BASE,
            {
                "model.lora_rank": 16,
                "model.lora_alpha": 32,
                "model.dtype": "float16",
                "model.init_kwargs": {"attn_implementation": "sdpa"},
                "eval_samples": 0,
            },
        )
    )
    assert (derived["ds.lora.rank"], derived["ds.lora.alpha"], derived["ds.param_dtype"]) == (16, 32, "fp16")
    assert (
        derived["ds.lora.target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
        and derived["ds.attn_implementation"] == "sdpa"
    )
    assert (derived["eval.n_samples_per_prompt"], derived["eval.temperature"]) == (1, 0.0)
    assert (
        flags.derived_flags(build_run_config(BASE, {"model.lora_target_modules": ["all-linear"]}))[
            "ds.lora.target_modules"
        ]
        is None
    )
    # precision.py
    assert flags.derived_flags(build_run_config(BASE, {"model.dtype": "float32"}))["ds.param_dtype"] == "fp32"
    assert flags.generate_kwargs_for(build_run_config(BASE, {"rollout.top_k": 20}), {"temperature": 1.0}) == {
        "temperature": 1.0,
        "top_k": 20,
    }


def test_openrlhf_namespace_values_flow_back_into_the_config():
    pytest.importorskip("openrlhf")
    from adora_openrlhf.backends.openrlhf import launcher

    # the recipe's flags say greedy (temperature 0)
    passthrough = [
        "--ds.lora.rank",
        "8",
        "--ds.lora.target_modules",
        "all-linear",
        "--ds.param_dtype",
        "fp16",
        "--eval.n_samples_per_prompt",
        "3",
        "--eval.temperature",
        "0.6",
    ]
    _, args, cfg = launcher.prepare(build_run_config(BASE), passthrough)
    assert (args.ds.lora.rank, cfg.model.lora_rank, cfg.model.lora_target_modules, cfg.model.dtype) == (
        8,
        8,
        ["all-linear"],
        "float16",
    )
    assert cfg.eval_samples == 3
    # the choice this package adds
    _, args, cfg = launcher.prepare(build_run_config(BASE), ["--ds.param_dtype", "fp32"])
    assert (args.ds.param_dtype, cfg.model.dtype) == ("fp32", "float32")


def test_local_trainer_refuses_before_touching_the_output_dir(tmp_path):
    from adora_openrlhf.backends.local.trainer import train

    with pytest.raises(ConfigError, match=r"^max_missing_reward_fraction: not supported by the local backend"):
        train(build_run_config("kk-tiny", {"max_missing_reward_fraction": 0.5, "output_dir": str(tmp_path / "run")}))
    assert not (tmp_path / "run").exists()


def test_the_docs_show_the_mapping_table():
    from adora_openrlhf.backends.openrlhf.field_flags import markdown_table

    docs = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "openrlhf_backend.md").read_text()
    start, end = docs.index("<!-- field_flags table -->\n"), docs.index("<!-- end field_flags table -->")
    # python -m adora_openrlhf.backends.openrlhf.field_flags
    assert docs[start + len("<!-- field_flags table -->\n") : end] == markdown_table()


def test_every_mapped_field_is_in_the_table_and_read_backs_name_real_fields():
    from adora_openrlhf.backends.openrlhf.field_flags import FIELD_FLAGS, mapped_fields

    assert set(mapped_fields()) <= set(LEAF_TYPES)
    mapped = {d for d, entry in BACKEND_FIELDS["openrlhf"].items() if entry == MAPPED}
    assert mapped <= set(mapped_fields())  # the support table's mapped fields come from FIELD_FLAGS
    assert all(entry.fields and entry.flags for entry in FIELD_FLAGS)


def test_an_estimator_openrlhf_does_not_know_goes_as_the_stand_in_and_keeps_its_name(monkeypatch):
    pytest.importorskip("openrlhf")
    from adora_openrlhf.algorithms import advantages
    from adora_openrlhf.backends.openrlhf import field_flags, flags, launcher

    entries = dict(advantages.ADVANTAGE_ESTIMATORS._entries)
    monkeypatch.setattr(advantages.ADVANTAGE_ESTIMATORS, "_entries", entries)  # registered for this test only
    advantages.register_estimator("toy_mean_only")(lambda rewards, mask, moments, eps: rewards - moments.mean)
    cfg = build_run_config(BASE, {"advantage.estimator": "toy_mean_only"})
    assert flags.derived_flags(cfg)["algo.advantage.estimator"] == field_flags.STAND_IN_ESTIMATOR == "group_norm"
    _, args, final = launcher.prepare(cfg, [])
    assert (args.algo.advantage.estimator, final.advantage.estimator) == ("group_norm", "toy_mean_only")
    _, args, final = launcher.prepare(cfg, ["--algo.advantage.estimator", "rloo"])  # a flag passed through wins
    assert final.advantage.estimator == "rloo"
    _, _, final = launcher.prepare(build_run_config(BASE, {"advantage.estimator": "rloo"}), [])
    assert final.advantage.estimator == "rloo"
