"""Typed configs, recipes and the command line: round trips and clear errors."""

import json

import pytest

from adora_openrlhf.cli_args import LEAF_TYPES, parse_value
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.dotted import nest
from adora_openrlhf.recipes import RECIPES, build_run_config
from adora_openrlhf.train import main


def test_run_config_round_trip():
    cfg = build_run_config("kk-tiny", {"adora.enabled": True, "sampling.escalation": [{"temperature": 1.3}]})
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.adora.enabled and again.sampling.escalation == [{"temperature": 1.3}]


def test_every_recipe_builds():
    for name in RECIPES:
        cfg = build_run_config(name)
        assert cfg.recipe == name and cfg.backend == RECIPES[name].backends[0]


def test_cluster_recipes_follow_their_reference_edge_policy():
    """K&K and DAPO follow the LLM reference's ADORA edge groups, Geometry3K the VLM reference's."""
    policies = {
        name: (build_run_config(name).adora.edge_policy, build_run_config(name).adora.truncation_length)
        for name in RECIPES
        if "openrlhf" in RECIPES[name].backends
    }
    for name, (policy, cut) in policies.items():
        if name.startswith("kk-"):
            assert (policy, cut) == ("llm", None), name
        elif name.startswith("dapo-"):
            assert (policy, cut) == ("llm", 3900), name
        else:
            assert name.startswith("geo3k-") and (policy, cut) == ("vlm", None), name


def test_nest():
    assert nest({"a.b": 1, "a.c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"sampling: unknown option\(s\) \['exit'\]"):
        RunConfig.from_dict({"sampling": {"exit": "pos"}})


def test_parse_value_types():
    assert parse_value("adora.enabled", LEAF_TYPES["adora.enabled"], "yes") is True
    assert parse_value("train.lr", LEAF_TYPES["train.lr"], "3e-4") == 3e-4
    assert parse_value("model.path", LEAF_TYPES["model.path"], "none") is None
    assert parse_value("sampling.escalation", LEAF_TYPES["sampling.escalation"], '[{"top_p": 0.9}]') == [{"top_p": 0.9}]
    assert parse_value("data.kk.num_people", LEAF_TYPES["data.kk.num_people"], "3") == [3]
    with pytest.raises(ConfigError, match="--adora.enabled"):
        parse_value("adora.enabled", LEAF_TYPES["adora.enabled"], "maybe")
    with pytest.raises(ConfigError, match="--sampling.escalation"):
        parse_value("sampling.escalation", LEAF_TYPES["sampling.escalation"], "{not json")


def test_cli_print_config(capsys):
    assert (
        main(["--recipe", "kk-tiny", "--print-config", "--estimator", "rloo", "--sampling.enabled", "true", "--n", "4"])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["advantage"]["estimator"] == "rloo" and printed["sampling"]["enabled"] is True


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--recipe", "nope"], "unknown recipe 'nope'"),
        (["--frobnicate", "1"], "unknown flag"),
        (["--adora.lambda_att", "7"], "adora.lambda_att"),
        (["--advantage.estimator", "gae_typo"], "advantage.estimator"),
        (["--sampling.enabled", "true", "--sampling.n_keep", "64"], "smaller than n_keep"),
    ],
)
def test_cli_errors_name_the_field(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--print-config"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# ---- --help, --config FILE ---------------------------------------------------------------------------------

from adora_openrlhf.cli_args import LEAF_FIELDS, field_help  # noqa: E402


def test_every_field_has_help_and_appears_in_help_output(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    text, packed = " ".join(out.split()), "".join(out.split())  # argparse wraps lines (also after hyphens)
    missing_help = [dotted for dotted in LEAF_FIELDS if not field_help(dotted).strip()]
    assert missing_help == []
    for dotted in LEAF_FIELDS:
        if dotted in ("recipe", "backend"):  # --recipe and --backend are flags of their own
            continue
        assert f"--{dotted} VALUE" in text, dotted
        assert "".join(field_help(dotted).split()) in packed, dotted
    assert "--train.lrVALUE,--lrVALUEAdamWlearningrate(default:1e-05)" in packed  # with its alias
    assert '(default:["q_proj","k_proj","v_proj","o_proj"])' in packed


def test_config_range_checks_still_apply_to_help_fields():
    with pytest.raises(ConfigError, match=r"adora.lambda_att: must be a finite number > 0 and <= 1, got 7"):
        build_run_config("kk-tiny", {"adora.lambda_att": 7})


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_print_config_round_trips_through_config_file(tmp_path, capsys, suffix):
    """--print-config output is a config file: loading it with --config resolves to the same config."""
    argv = [
        "--recipe",
        "kk-tiny-adora",
        "--adora.lambda_att",
        "0.25",
        "--sampling.escalation",
        '[{"temperature": 1.3}]',
        "--steps",
        "7",
    ]
    assert main(argv + ["--print-config"]) == 0
    printed = capsys.readouterr().out
    file = tmp_path / f"run{suffix}"
    if suffix == ".yaml":
        import yaml

        file.write_text(yaml.safe_dump(json.loads(printed)))
    else:
        file.write_text(printed)
    assert main(["--config", str(file), "--print-config"]) == 0  # the file's recipe is the base
    again = capsys.readouterr().out
    assert json.loads(again) == json.loads(printed)
    assert json.loads(again)["recipe"] == "kk-tiny-adora" and json.loads(again)["adora"]["lambda_att"] == 0.25


def test_config_file_sits_between_recipe_and_flags(tmp_path, capsys):
    file = tmp_path / "partial.yaml"
    # YAML 1.1 reads 2e-3 as a string
    file.write_text("steps: 3\nadora:\n  enabled: true\n  lambda_att: 0.5\ntrain:\n  lr: 2e-3\n")
    assert main(["--recipe", "kk-tiny", "--config", str(file), "--train.lr", "0.004", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    recipe = build_run_config("kk-tiny")
    # file over recipe
    assert cfg["steps"] == 3 and cfg["adora"]["enabled"] is True and cfg["adora"]["lambda_att"] == 0.5
    assert cfg["train"]["lr"] == 0.004  # flag over file
    assert cfg["sampling"] == recipe.to_dict()["sampling"]  # recipe where the file says nothing


@pytest.mark.parametrize(
    "text, message",
    [
        ("adora:\n  lamda_att: 0.5\n", "unknown key 'adora.lamda_att'; valid keys under 'adora':"),
        ("stepz: 3\n", "unknown key 'stepz'"),
        ("adora: 3\n", "adora must be a mapping"),
        ("- 1\n- 2\n", "a config file holds a mapping"),
        ("adora: {enabled: [\n", "not valid YAML or JSON"),
    ],
)
def test_config_file_errors_name_the_key(tmp_path, capsys, text, message):
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(file), "--print-config"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and str(file) in err and len(err.strip().splitlines()) == 1


def test_config_file_missing(capsys):
    with pytest.raises(SystemExit):
        main(["--config", "/nonexistent/run.yaml", "--print-config"])
    assert "--config: /nonexistent/run.yaml is not a file" in capsys.readouterr().err


def test_list_of_names_flag_takes_comma_list_and_all_linear():
    assert parse_value("model.lora_target_modules", LEAF_TYPES["model.lora_target_modules"], "q_proj,v_proj") == [
        "q_proj",
        "v_proj",
    ]
    assert parse_value("model.lora_target_modules", LEAF_TYPES["model.lora_target_modules"], "all-linear") == [
        "all-linear"
    ]
    assert build_run_config("kk-tiny", {"model.lora_target_modules": "all-linear"}).model.lora_target_modules == [
        "all-linear"
    ]
    with pytest.raises(ConfigError, match="all-linear"):
        build_run_config("kk-tiny", {"model.lora_target_modules": ["all-linear", "q_proj"]})


@pytest.mark.parametrize(
    "value, message",
    [
        ("[1, 2]", "model.init_kwargs"),
        ('{"torch_dtype": "bfloat16"}', "model.init_kwargs.torch_dtype: is set by the run itself (use model.dtype)"),
        ("{not json", "--model.init_kwargs: cannot parse"),
    ],
)
def test_init_kwargs_is_validated_as_a_json_object(value, message, capsys):
    with pytest.raises(SystemExit):
        main(["--model.init_kwargs", value, "--print-config"])
    assert message in capsys.readouterr().err


def test_init_kwargs_parses():
    cfg = build_run_config(
        "kk-tiny",
        {
            "model.init_kwargs": parse_value(
                "model.init_kwargs", LEAF_TYPES["model.init_kwargs"], '{"trust_remote_code": true}'
            )
        },
    )
    assert cfg.model.init_kwargs == {"trust_remote_code": True}


def test_a_mapping_field_override_replaces_the_recipes_mapping_and_a_section_mapping_merges():
    """kk-testbed's phase-2 mixture is {"thorough": 0.25, "restate": 0.75}: an override of the field is the
    whole new mixture; a mapping for a section (adora) changes only the keys it names."""
    recipe = build_run_config("kk-testbed")
    assert recipe.warmup.mix == {"thorough": 0.25, "restate": 0.75}
    cfg = build_run_config(
        "kk-testbed", {"warmup.mix": {"thorough": 1.0}, "warmup.style_shares": {"thorough": 0.5, "shortcut": 0.5}}
    )
    assert cfg.warmup.mix == {"thorough": 1.0}
    assert cfg.warmup.style_shares == {"thorough": 0.5, "shortcut": 0.5}
    assert cfg.warmup.steps == recipe.warmup.steps  # the rest of the section is the recipe's
    adora = build_run_config("kk-testbed-adora", {"adora": {"mode": "amplify"}}).adora
    assert adora.mode == "amplify" and adora.enabled and adora.edge_policy == "llm"
    init = build_run_config("kk-testbed", {"model.init_kwargs": {"attn_implementation": "eager"}}).model.init_kwargs
    assert init == {"attn_implementation": "eager"}


def test_mapping_field_override_from_the_command_line_replaces(capsys):
    assert main(["--recipe", "kk-testbed", "--warmup.mix", '{"thorough": 1.0}', "--print-config"]) == 0
    assert '"mix": {\n      "thorough": 1.0\n    }' in capsys.readouterr().out


def test_an_unknown_option_is_refused_wherever_a_config_is_read(tmp_path, capsys):
    """An option the config does not have (here a name of the unreleased development line, ``data.kk_num_people``)
    is refused as a flag, a config file's key, an override and in a saved config; ``--resume`` names it."""
    from adora_openrlhf.rundir.checks import config_differences

    def exit_status(argv):
        try:
            return main(argv)
        except SystemExit as stop:
            return stop.code

    assert exit_status(["--recipe", "kk-tiny", "--print-config", "--data.kk_num_people", "[3]"]) == 2
    assert "--data.kk_num_people" in capsys.readouterr().err
    file = tmp_path / "old.yaml"
    file.write_text("data:\n  geo_levels: [1, 2]\n")
    assert exit_status(["--recipe", "kk-tiny", "--config", str(file), "--print-config"]) == 2
    assert "geo_levels" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="geo_tasks"):
        build_run_config("kk-testbed", {"data.geo_tasks": ["count"]})
    cfg = build_run_config("kk-testbed")
    saved = cfg.to_dict()
    saved["data"]["kk_num_people"] = [3]
    with pytest.raises(ConfigError, match="kk_num_people"):
        RunConfig.from_dict(saved)
    assert "data.kk_num_people" in config_differences(saved, cfg.to_dict())  # --resume names it
    saved = cfg.to_dict()
    del saved["model"]["numerics"]  # a saved config holds every option: one it lacks is a difference
    assert config_differences(saved, cfg.to_dict()) == ["model.numerics"]


def test_the_sampler_counts_positives_at_adoras_correctness_threshold_unless_told_otherwise():
    """One correctness threshold per run: ``sampling.positive_threshold`` left unset (None) is
    ``adora.correct_threshold`` (also after a recipe and a flag changed it); set, it stays the sampler's own."""
    assert RunConfig.from_dict({}).positive_threshold == 0.5
    assert RunConfig.from_dict({"adora": {"correct_threshold": 1.0}}).positive_threshold == 1.0
    own = RunConfig.from_dict({"adora": {"correct_threshold": 1.0}, "sampling": {"positive_threshold": 0.7}})
    assert (own.adora.correct_threshold, own.positive_threshold) == (1.0, 0.7)
    flagged = build_run_config("kk-tiny", {"adora.correct_threshold": 2.0})
    assert (flagged.sampling.positive_threshold, flagged.positive_threshold) == (None, 2.0)
    assert RunConfig.from_dict(flagged.to_dict()).positive_threshold == 2.0  # a saved config reads the same
    for name, recipe in RECIPES.items():  # no recipe repeats the threshold in the sampler's section
        assert "positive_threshold" not in recipe.overrides.get("sampling", {}), name


def test_a_run_saved_with_the_threshold_written_out_resumes_where_it_is_unset():
    from adora_openrlhf.rundir.checks import config_differences

    now = build_run_config("kk-tiny").to_dict()  # sampling.positive_threshold unset, adora.correct_threshold 1.0
    saved = json.loads(json.dumps(now))
    saved["sampling"]["positive_threshold"] = 1.0
    assert config_differences(saved, now) == []
    saved["sampling"]["positive_threshold"] = 0.5  # another threshold is a change
    assert config_differences(saved, now) == ["sampling.positive_threshold"]
