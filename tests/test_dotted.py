"""The dotted-name walker of the config plumbing (adora_openrlhf/dotted.py): hand cases and round trips."""

from __future__ import annotations

import types

from hypothesis import given
from hypothesis import strategies as st

from adora_openrlhf.config import RunConfig
from adora_openrlhf.dotted import dataclass_leaves, flatten, merge, nest, overlay, value_at


def test_flatten_walks_sections_and_keeps_empty_or_named_mappings_whole():
    values = {"adora": {"enabled": True, "mode": "amplify"}, "extra": {"a": 1}, "empty": {}, "steps": 3}
    assert flatten(values) == {"adora.enabled": True, "adora.mode": "amplify", "extra.a": 1, "empty": {}, "steps": 3}
    assert flatten(values, is_leaf=lambda name: name == "extra") == {
        "adora.enabled": True,
        "adora.mode": "amplify",
        "extra": {"a": 1},
        "empty": {},
        "steps": 3,
    }


def test_merge_is_recursive_and_copies():
    base = {"a": {"b": 1, "c": [1]}, "d": 2}
    out = merge(base, {"a": {"b": 5}, "e": {"f": 1}})
    assert out == {"a": {"b": 5, "c": [1]}, "d": 2, "e": {"f": 1}}
    out["a"]["c"].append(2)
    assert base == {"a": {"b": 1, "c": [1]}, "d": 2}


def test_overlay_merges_sections_and_replaces_mapping_fields_whole():
    values = {
        "warmup": {"mix": {"direct": 0.5, "thorough": 0.5}, "steps": 4},
        "adora": {"enabled": False, "mode": "amplify"},
    }
    out = overlay(
        values,
        {"warmup.mix": {"thorough": 1.0}, "adora": {"enabled": True}},
        is_field=lambda name: name == "warmup.mix",
    )
    assert out == {"warmup": {"mix": {"thorough": 1.0}, "steps": 4}, "adora": {"enabled": True, "mode": "amplify"}}


def test_value_at_reads_attributes_and_mappings():
    cfg = RunConfig()
    assert value_at(cfg, "adora.enabled") is cfg.adora.enabled
    assert value_at(types.SimpleNamespace(vllm=types.SimpleNamespace(num_engines=2)), "vllm.num_engines") == 2
    assert value_at({"a": {"b": 3}}, "a.b") == 3
    assert value_at(cfg, "adora.no_such_field") is None


def test_dataclass_leaves_names_every_leaf_of_the_run_config():
    leaves = {name: hint for name, _, hint in dataclass_leaves(RunConfig)}
    assert leaves["adora.enabled"] is bool and leaves["steps"] is int
    assert not any(name == "adora" for name in leaves)
    assert set(flatten(RunConfig().to_dict(), is_leaf=lambda name: name in leaves)) == set(leaves)


_keys = st.text(alphabet="abcxyz_", min_size=1, max_size=4)
_nested = st.recursive(
    st.integers() | st.booleans() | st.text(max_size=3),
    lambda inner: st.dictionaries(_keys, inner, min_size=1, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(_keys, _nested, max_size=4))
def test_nest_inverts_flatten(values):
    assert nest(flatten(values)) == values


@given(st.dictionaries(_keys, _nested, max_size=4), st.dictionaries(_keys, _nested, max_size=4))
def test_merge_keeps_every_flat_change(base, changes):
    merged = flatten(merge(base, changes))
    for name, value in flatten(changes).items():
        assert merged[name] == value
