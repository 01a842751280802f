"""fp32 training on the openrlhf backend (``backends/openrlhf/cpu/precision.py``), against the real openrlhf 0.11.2."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openrlhf", reason="needs requirements/openrlhf-cpu-test.txt")

from adora_openrlhf.backends.openrlhf.compat.entry import parse_openrlhf_args, with_param_dtype_choice
from adora_openrlhf.backends.openrlhf.cpu import precision
from adora_openrlhf.config import ConfigError
from adora_openrlhf.recipes import build_run_config


def test_param_dtypes_map_to_torch_dtypes():
    assert precision.convert_param_dtype("fp32") is torch.float32
    assert (
        precision.convert_param_dtype("bf16") is torch.bfloat16
        and precision.convert_param_dtype("fp16") is torch.float16
    )


def test_install_answers_openrlhfs_converter_and_keeps_its_values():
    from openrlhf.utils import utils

    precision.install()
    precision.install()  # a second import of the actor module changes nothing
    assert utils.convert_to_torch_dtype is precision.convert_param_dtype
    assert utils._openrlhf_convert_to_torch_dtype is not precision.convert_param_dtype
    assert (
        utils.convert_to_torch_dtype("fp32") is torch.float32 and utils.convert_to_torch_dtype("bf16") is torch.bfloat16
    )


def test_the_parser_accepts_fp32_and_still_refuses_other_values(capsys):
    args = parse_openrlhf_args(["--reward.remote_url", "r.py", "--ds.param_dtype", "fp32"])
    assert args.ds.param_dtype == "fp32"
    assert parse_openrlhf_args(["--reward.remote_url", "r.py"]).ds.param_dtype == "bf16"  # OpenRLHF's default kept
    with pytest.raises(
        ConfigError, match=r"argument --ds.param_dtype: invalid choice: 'fp8' \(choose from 'bf16', 'fp16', 'fp32'\)"
    ):
        parse_openrlhf_args(["--reward.remote_url", "r.py", "--ds.param_dtype", "fp8"])


def test_choice_is_added_once_and_a_changed_parser_is_refused():
    source = 'p.add_argument("--ds.param_dtype", type=str, default="bf16", choices=["bf16", "fp16"])'
    tree = with_param_dtype_choice(with_param_dtype_choice(ast.parse(source)))
    assert ast.unparse(tree).count("'fp32'") == 1 and "choices=['bf16', 'fp16', 'fp32']" in ast.unparse(tree)
    with pytest.raises(ConfigError, match="no --ds.param_dtype option"):
        with_param_dtype_choice(ast.parse('p.add_argument("--ds.param_dtype", choices=CHOICES)'))


def test_deepspeed_config_for_fp32_turns_half_precision_off():
    import importlib.util

    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "openrlhf"))
    from openrlhf_audit import module_path

    # the file itself: the package's __init__ imports flash-attn, absent from this venv
    spec = importlib.util.spec_from_file_location(
        "deepspeed_utils", module_path("openrlhf.utils.deepspeed.deepspeed_utils")
    )
    deepspeed_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deepspeed_utils)
    get_train_ds_config, get_eval_ds_config = deepspeed_utils.get_train_ds_config, deepspeed_utils.get_eval_ds_config

    for config in (
        get_train_ds_config(offload=False, param_dtype="fp32"),
        get_eval_ds_config(offload=False, param_dtype="fp32"),
    ):
        assert config["bf16"]["enabled"] is False and config["fp16"]["enabled"] is False
    assert get_train_ds_config(offload=False, param_dtype="bf16")["bf16"]["enabled"] is True


def test_the_launch_names_the_engines_dtype():
    from adora_openrlhf.backends.openrlhf.launcher import prepare, ray_env_vars

    testbed = build_run_config("kk-testbed-openrlhf")
    argv, args, cfg = prepare(testbed, [])
    assert args.ds.param_dtype == "fp32" and ray_env_vars(cfg)[precision.ENGINE_DTYPE_ENV] == "float32"
    _, args, cfg = prepare(testbed, ["--ds.param_dtype", "bf16"])  # the user's flag wins, the engines follow it
    assert cfg.model.dtype == "bfloat16" and ray_env_vars(cfg)[precision.ENGINE_DTYPE_ENV] == "bfloat16"


def test_engine_dtype_from_the_environment(monkeypatch):
    monkeypatch.delenv(precision.ENGINE_DTYPE_ENV, raising=False)
    assert precision.engine_dtype_from_env("bfloat16") == "bfloat16"
    monkeypatch.setenv(precision.ENGINE_DTYPE_ENV, "float32")
    assert precision.engine_dtype_from_env("bfloat16") == "float32"
