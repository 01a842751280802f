"""Typed configs, recipes and the command line: round trips and clear errors."""

import json

import pytest

from adora_openrlhf.cli_args import LEAF_TYPES, parse_value
from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.recipes import RECIPES, build_run_config, nest
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
    policies = {name: (build_run_config(name).adora.edge_policy, build_run_config(name).adora.truncation_length) for name in RECIPES if "openrlhf" in RECIPES[name].backends}
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
    assert parse_value("data.kk_num_people", LEAF_TYPES["data.kk_num_people"], "3") == [3]
    with pytest.raises(ConfigError, match="--adora.enabled"):
        parse_value("adora.enabled", LEAF_TYPES["adora.enabled"], "maybe")
    with pytest.raises(ConfigError, match="--sampling.escalation"):
        parse_value("sampling.escalation", LEAF_TYPES["sampling.escalation"], "{not json")


def test_cli_print_config(capsys):
    assert main(["--recipe", "kk-tiny", "--print-config", "--estimator", "rloo", "--sampling.enabled", "true", "--n", "4"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["advantage"]["estimator"] == "rloo" and printed["sampling"]["enabled"] is True


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--recipe", "nope"], "unknown recipe 'nope'"),
        (["--frobnicate", "1"], "unknown flag"),
        (["--adora.lambda_att", "7"], "adora.lambda_att"),
        (["--advantage.estimator", "gae"], "advantage.estimator"),
        (["--sampling.enabled", "true", "--sampling.n_keep", "64"], "smaller than n_keep"),
    ],
)
def test_cli_errors_name_the_field(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--print-config"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
