"""The one Registry type: its error format, duplicate registration, and every registry of the package built on it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.config import ConfigError, RunConfig
from adora_openrlhf.registry import Registry, UnknownNameError


def test_error_names_the_field_and_lists_the_choices():
    reg: Registry[int] = Registry("colour", "paint.colour")
    reg.add("red", 1)
    reg.register("blue", "navy")(2)
    assert reg.get("navy") == 2 and reg["red"] == 1
    with pytest.raises(UnknownNameError) as info:
        reg.get("green")
    assert str(info.value) == "paint.colour: unknown colour 'green'; choose one of ['blue', 'navy', 'red']"
    # one error type that every caller already handles: a ConfigError (one line at the CLI) and a KeyError (dict lookups)
    assert (
        isinstance(info.value, ConfigError) and isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    )
    with pytest.raises(UnknownNameError, match=r"unknown colour \['x'\]"):  # an unhashable value from a config file
        reg.get(["x"])  # type: ignore[arg-type]


def test_duplicates_and_empty_names_are_refused():
    reg: Registry[int] = Registry("colour", "paint.colour")
    reg.add("red", 1)
    with pytest.raises(ValueError, match="colour 'red' is already registered"):
        reg.register("blue", "red")(2)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", 3)
    assert reg.get("red") == 1


def test_mapping_views_keep_registration_order():
    reg: Registry[str] = Registry("thing", "f")
    for name in ("b", "a", "c"):
        reg.add(name, name.upper())
    assert list(reg) == ["b", "a", "c"] and reg.names() == ["a", "b", "c"] and len(reg) == 3
    assert reg.items() == [("b", "B"), ("a", "A"), ("c", "C")] and reg.values() == ["B", "A", "C"]
    assert "a" in reg and "z" not in reg and ["a"] not in reg
    assert reg.check("a") == "a"


def test_loader_runs_once_before_the_first_lookup_and_again_after_a_failure():
    calls = []
    reg: Registry[int] = Registry("plugin", "plugins.name", loader=lambda: (calls.append(1), reg.add("late", 7)))
    assert calls == []
    assert reg.get("late") == 7 and reg.names() == ["late"] and calls == [1]

    attempts = []

    def failing():
        attempts.append(1)
        raise ImportError("missing")

    broken: Registry[int] = Registry("plugin", "plugins.name", loader=failing)
    for _ in range(2):
        with pytest.raises(ImportError):
            broken.names()
    assert len(attempts) == 2


@given(names=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8, unique=True), probe=st.text(max_size=8))
def test_lookup_matches_the_registered_set(names, probe):
    reg: Registry[int] = Registry("thing", "f")
    for i, name in enumerate(names):
        reg.add(name, i)
    assert reg.names() == sorted(names)
    if probe in names:
        assert reg.get(probe) == names.index(probe)
    else:
        with pytest.raises(UnknownNameError) as info:
            reg.get(probe)
        assert str(info.value) == f"f: unknown thing {probe!r}; choose one of {sorted(names)}"


def _registries():
    from adora_openrlhf.algorithms.adora import EDGE_POLICIES, GROUP_RULES
    from adora_openrlhf.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from adora_openrlhf.algorithms.policy_loss import LOSS_AGGREGATIONS
    from adora_openrlhf.algorithms.sampling import EXIT_RULES
    from adora_openrlhf.prompt_templates import PROMPT_TEMPLATES
    from adora_openrlhf.recipes import RECIPES
    from adora_openrlhf.rewards.base import REWARD_FUNCTIONS
    from adora_openrlhf.tasks.behaviours import DEMONSTRATIONS, RESPONSE_PROBES, SUBSET_RULES

    return {
        "advantage.estimator": (ADVANTAGE_ESTIMATORS, {"group_norm", "dr_grpo", "reinforce_baseline", "rloo"}),
        "adora.rule": (GROUP_RULES, {"length", "difficulty"}),
        "adora.edge_policy": (EDGE_POLICIES, {"vlm", "llm"}),
        "sampling.exit_rule": (EXIT_RULES, {"balance", "pos"}),
        "train.loss_agg": (LOSS_AGGREGATIONS, {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}),
        "data.prompt_template": (PROMPT_TEMPLATES, {"auto", "chat", "compact"}),
        "source": (REWARD_FUNCTIONS, {"kk", "dapo_math", "geometry3k", "mathvista", "geo_synth"}),
        "recipe": (RECIPES, {"kk-tiny", "kk-testbed", "geo-tiny", "dapo-math-adora"}),
        "demonstrations": (DEMONSTRATIONS, {"kk"}),
        "probes": (RESPONSE_PROBES, {"kk", "geo_synth"}),
        "subsets": (SUBSET_RULES, {"kk", "geo_synth", "math500", "mathvista"}),
    }


def test_a_task_declares_its_behaviours_for_its_own_sources_only():
    from adora_openrlhf.tasks.behaviours import Probe
    from adora_openrlhf.tasks.registry import Task

    with pytest.raises(ValueError, match=r"task 'toy': probes for sources \['other'\] it does not read"):
        Task("toy", ("toy",), probes={"other": Probe(str, ("a",))})
    with pytest.raises(ValueError, match="randomised_styles must name"):
        Task("toy", ("toy",), demonstrations={"toy": {"direct": str}}, randomised_styles=frozenset({("toy", "guess")}))


@pytest.mark.parametrize("key", list(_registries()))
def test_every_registry_of_the_package_is_a_registry(key):
    reg, expected = _registries()[key]
    assert isinstance(reg, Registry)
    assert expected <= set(reg.names())
    with pytest.raises(UnknownNameError, match=f"unknown {reg.kind} 'no-such-name'; choose one of"):
        reg.get("no-such-name")


def test_demonstration_styles_are_a_registry_per_source():
    from adora_openrlhf.tasks.behaviours import DEMONSTRATIONS

    styles = DEMONSTRATIONS.get("kk")
    assert isinstance(styles, Registry) and {"direct", "thorough", "shortcut"} <= set(styles)
    with pytest.raises(
        ConfigError, match=r"^warmup.style \(rows of source 'kk'\): unknown style 'deep'; choose one of \["
    ):
        styles.get("deep")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"advantage": {"estimator": "gae_typo"}},
            "advantage.estimator: unknown advantage estimator 'gae_typo'; choose one of [",
        ),
        ({"adora": {"rule": "x"}}, "adora.rule: unknown ADORA rule 'x'; choose one of ['difficulty', 'length']"),
        ({"adora": {"edge_policy": "x"}}, "adora.edge_policy: unknown edge policy 'x'; choose one of ['llm', 'vlm']"),
        (
            {"sampling": {"exit_rule": "x"}},
            "sampling.exit_rule: unknown exit rule 'x'; choose one of ['balance', 'pos']",
        ),
        ({"train": {"loss_agg": "sum"}}, "train.loss_agg: unknown loss aggregation 'sum'; choose one of ["),
        (
            {"data": {"prompt_template": "x"}},
            "data.prompt_template: unknown prompt template 'x'; choose one of ['auto', 'chat', 'compact']",
        ),
    ],
)
def test_config_validates_names_through_the_registries(overrides, message):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(overrides)
    assert str(info.value).startswith(message)


def test_unknown_recipe_is_one_config_error():
    from adora_openrlhf.recipes import build_run_config

    with pytest.raises(ConfigError, match=r"^recipe: unknown recipe 'nope'; choose one of \[.*'kk-tiny'"):
        build_run_config("nope")


def test_no_import_circle_between_config_and_the_algorithm_core():
    """The algorithm modules and the registries import without config.py; config imports them only to validate."""
    code = (
        "import sys\n"
        "import adora_openrlhf.algorithms, adora_openrlhf.algorithms.pipeline, adora_openrlhf.registry\n"
        "assert 'adora_openrlhf.config' not in sys.modules, sorted(m for m in sys.modules if m.startswith('adora'))\n"
        "import adora_openrlhf.config as c\n"
        "c.RunConfig()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
