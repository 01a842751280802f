"""Every config field has its valid range, checked when the config is built, with one error naming the field."""

import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.cli_args import LEAF_TYPES, parse_value
from adora_openrlhf.config import AdaptiveSamplingConfig, ConfigError, PolicyLossConfig, SamplingParams
from adora_openrlhf.recipes import build_run_config


@pytest.mark.parametrize("value", [-1.0, 0.0, math.nan, math.inf])
def test_max_grad_norm_must_be_positive(value):
    # -1 flipped every gradient (training ascended the loss) and 0 froze it; both were accepted
    with pytest.raises(ConfigError, match=r"^train.max_grad_norm: must be a finite number > 0"):
        PolicyLossConfig(max_grad_norm=value)
    assert PolicyLossConfig(max_grad_norm=0.5).max_grad_norm == 0.5


def test_escalation_entries_are_range_checked_at_parse_time():
    # used to fail only when the entry was first used: after the warm-up, evaluation and first checkpoint
    with pytest.raises(
        ConfigError, match=r"^sampling.escalation\[1\].temperature: must be a finite number > 0, got -0.5"
    ):
        AdaptiveSamplingConfig(escalation=[{"temperature": 1.2}, {"temperature": -0.5}])
    with pytest.raises(ConfigError, match=r"^sampling.escalation\[0\].top_k: must be an integer >= 1 or -1, got 2.5"):
        AdaptiveSamplingConfig(escalation=[{"top_k": 2.5}])
    assert AdaptiveSamplingConfig(escalation=[{"top_k": -1, "min_p": 0.05}]).escalation[0]["min_p"] == 0.05


def test_list_elements_and_types_are_named():
    with pytest.raises(ConfigError, match=r"^data.kk.num_people\[2\]: must be an integer >= 2 and <= 8, got 9"):
        build_run_config("kk-tiny", {"data.kk.num_people": [2, 3, 9]})
    with pytest.raises(ConfigError, match=r"^rollout.temperature: must be a finite number > 0, got 'hot'"):
        SamplingParams(temperature="hot")
    with pytest.raises(ConfigError, match=r"^steps: must be an integer >= 1, got True"):
        build_run_config("kk-tiny", {"steps": True})


NUMERIC = sorted(
    name
    for name, hint in LEAF_TYPES.items()
    if (typing.get_args(hint) or (hint,))[0] in (int, float) and name not in ("recipe", "backend")
)
ANY_VALUE = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(NUMERIC), value=ANY_VALUE)
def test_any_value_of_any_numeric_field_is_accepted_or_refused_by_name(name, value):
    """Property: a value is either accepted or refused with a ConfigError that starts with the field's name;
    never a TypeError or a traceback from deep inside, and an accepted value is finite."""
    try:
        cfg = build_run_config("kk-tiny", {name: value})
    except ConfigError as err:
        assert str(err).startswith(name.split(".")[0]), (name, value, str(err))
        assert "\n" not in str(err)
        return
    accepted = cfg.to_dict()
    for part in name.split("."):
        accepted = accepted[part]
    # list fields (data.kk.num_people, ...): every element
    values = accepted if isinstance(accepted, list) else [accepted]
    assert all(v is None or (not isinstance(v, bool) and math.isfinite(v)) for v in values), (name, value)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(LEAF_TYPES)), text=st.text(max_size=8))
def test_any_flag_text_is_parsed_or_refused_by_flag_name(name, text):
    try:
        value = parse_value(name, LEAF_TYPES[name], text)
    except ConfigError as err:
        assert str(err).startswith(f"--{name}: cannot parse")
        return
    try:
        build_run_config("kk-tiny", {name: value})
    except ConfigError as err:
        assert "\n" not in str(err)


@pytest.mark.parametrize(
    "field, bad, expected",
    [
        ("model.kv_cache", "huge", "model.kv_cache: unknown KV cache 'huge'; choose one of"),
        ("model.decoding", "fast", "model.decoding: unknown decoding 'fast'; choose one of"),
        (
            "model.dtype",
            "float8",
            "model.dtype: unknown dtype 'float8'; choose one of ['float32', 'bfloat16', 'float16']",
        ),
        (
            "data.kk.parser",
            "strict",
            "data.kk.parser: unknown K&K answer parser 'strict'; choose one of ['lenient', 'logic_rl']",
        ),
        ("data.kk.name_order", "shuffled", "data.kk.name_order: unknown name order 'shuffled'; choose one of"),
        ("data.geo.tasks", ["count", "shade"], "data.geo.tasks[1]: unknown geometry task 'shade'; choose one of"),
        ("sampling.pool_scope", "epoch", "sampling.pool_scope: unknown pool scope 'epoch'; choose one of"),
        ("adora.mode", "both", "adora.mode: unknown mode 'both'; choose one of ['attenuate', 'amplify']"),
        ("adora.rule", "both", "adora.rule: unknown ADORA rule 'both'; choose one of"),
        ("allocation.method", "greedy", "allocation.method: unknown allocator 'greedy'; choose one of"),
    ],
)
def test_every_one_of_field_says_the_same_thing(field, bad, expected):
    """One wording for a value outside its choices, whether the choices are a fixed set or a registry."""
    with pytest.raises(ConfigError) as err:
        build_run_config("kk-tiny", {field: bad})
    assert str(err.value).startswith(expected)
