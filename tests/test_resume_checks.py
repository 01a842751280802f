"""What ``--resume`` checks before it writes anything: the checkpoint's files against their checksums, the config
and data fingerprints the checkpoint carries, ``steps`` against the checkpoint's step; ``--resume-from``; a save
on a full disk; a ``--model`` whose weights or tokenizer do not fit it. Every refusal is one ConfigError line
naming the file or option and what to do, and leaves the run directory as it was."""

import errno
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.config import ConfigError
from adora_openrlhf.engine.model_source import safetensors_problem, weight_files_problem
from adora_openrlhf.rundir import checkpoints as ckpt
from adora_openrlhf.rundir import checks as rundir
from adora_openrlhf.rundir.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_runs import snapshot, tiny_kk_config

FAST = {"steps": 2, "save_every": 1}  # with tiny_runs.TINY_KK


def _cfg(out, **extra):
    return tiny_kk_config(out, **{**FAST, **extra})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-step run with checkpoints of steps 0, 1 and 2."""
    out = tmp_path_factory.mktemp("runs") / "run"
    train(_cfg(out))
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A private copy of the finished run."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _refused(out, match, **kwargs):
    """Resume ``out`` expecting a ConfigError matching ``match``; nothing in ``out`` may change."""
    before = snapshot(out)
    cfg_extra = kwargs.pop("cfg", {})
    with pytest.raises(ConfigError, match=match) as err:
        train(_cfg(out, **{"steps": 3, **cfg_extra}), **{"resume": True, **kwargs})
    assert snapshot(out) == before
    assert "\n" not in str(err.value)
    return str(err.value)


# ---------------------------------------------------------------------------------------------------------
# the checkpoint carries the config and the data fingerprints
# ---------------------------------------------------------------------------------------------------------


def test_checkpoint_records_config_data_and_checksums(finished):
    step = finished / "checkpoints" / "step_000002"
    record = json.loads((step / "trainer_state" / "run.json").read_text())
    assert record["config"] == _cfg(finished).to_dict()
    assert set(record["data"]) == {"train", "eval"} and record["data"]["eval"]["rows"] == 2
    manifest = json.loads((step / "trainer_state" / "manifest.json").read_text())["files"]
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "trainer_state/state.pt",
        "trainer_state/run.json",
    } <= set(manifest)
    assert manifest["model.safetensors"]["bytes"] == (step / "model.safetensors").stat().st_size
    assert ckpt.checkpoint_problem(step) is None


@pytest.mark.parametrize(
    "change", [{"train.lr": 0.5}, {"seed": 7}, {"rollout.temperature": 0.5}, {"adora.enabled": True}]
)
def test_resume_without_the_runs_config_json_still_compares_the_config(run, change):
    (run / "config.json").unlink()  # e.g. only checkpoints/ was copied
    name = next(iter(change))
    message = _refused(
        run, f"--resume: the config differs from the config saved in checkpoint step_000002 in {name}", cfg=change
    )
    assert "only ['eval_every', 'output_dir', 'report_to', 'save_every', 'steps'] may change" in message


def test_resume_may_change_steps_and_reporting_without_config_json(run):
    (run / "config.json").unlink()
    summary = train(_cfg(run, steps=3, save_every=2, eval_every=5), resume=True)
    assert summary["resumed_from_step"] == 2 and json.loads((run / "config.json").read_text())["steps"] == 3


def test_a_checkpoint_without_its_run_json_or_manifest_is_broken(run):
    """Every checkpoint has both files: one without either is refused as broken, naming the file, whatever the
    run's config.json says."""
    step = run / "checkpoints" / "step_000002"
    (step / "trainer_state" / "run.json").unlink()  # listed in the manifest
    _refused(
        run,
        "step_000002' is broken: trainer_state/run.json is missing; resume from step_000001 with --resume-from step_000001",
    )
    ckpt.write_manifest(step)  # a manifest that no longer lists it: still no config to compare
    _refused(run, "step_000002' is broken: trainer_state/run.json is missing; resume from step_000001")
    for path in (run / "checkpoints").glob("*/trainer_state"):
        (path / "manifest.json").unlink()
    _refused(
        run,
        "step_000002' is broken: trainer_state/manifest.json is missing; no earlier checkpoint is complete: start a "
        "new run with --overwrite",
    )


@pytest.mark.parametrize("edit", ["meta", "prompt", "drop_row", "swap_rows"])
def test_data_edited_in_place_is_refused_on_resume(tmp_path, edit):
    from adora_openrlhf.tasks.kk import generate_rows

    data = tmp_path / "train.jsonl"
    rows = generate_rows(8, [2], seed=1)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    train(_cfg(out, steps=1, **{"data.train_path": str(data)}))
    if edit == "meta":
        rows[0]["meta"]["difficulty"] = 3
    elif edit == "prompt":
        rows[1]["prompt"][-1]["content"] += " Think carefully."
    elif edit == "drop_row":
        rows.pop(0)
    else:
        rows[0], rows[1] = rows[1], rows[0]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))  # same path: the config alone cannot tell
    message = rf"--resume: the training rows differ from those checkpoint step_000001 was trained on .*data.train_path '{data}' changed"
    _refused(out, message, cfg={"data.train_path": str(data)})


def test_edited_held_out_rows_are_refused_on_resume(tmp_path):
    from adora_openrlhf.tasks.kk import generate_rows

    train_file, eval_file = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train_file.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(8, [2], seed=1)))
    held = generate_rows(2, [3], seed=2)
    eval_file.write_text("".join(json.dumps(r) + "\n" for r in held))
    out = tmp_path / "run"
    paths = {"data.train_path": str(train_file), "data.eval_path": str(eval_file)}
    train(_cfg(out, steps=1, **paths))
    eval_file.write_text("".join(json.dumps(r) + "\n" for r in held[::-1]))
    _refused(
        out,
        f"--resume: the held-out rows differ .*data.eval_path '{eval_file}' changed after the run started",
        cfg=paths,
    )


def test_reformatting_the_data_file_is_not_a_change(tmp_path):
    from adora_openrlhf.tasks.kk import generate_rows

    data = tmp_path / "train.jsonl"
    rows = generate_rows(8, [2], seed=1)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    train(_cfg(out, steps=1, **{"data.train_path": str(data)}))
    # key order, blank line
    data.write_text("\n".join(json.dumps(dict(reversed(list(r.items()))), indent=None) for r in rows) + "\n\n")
    assert train(_cfg(out, steps=2, **{"data.train_path": str(data)}), resume=True)["resumed_from_step"] == 1


# ---------------------------------------------------------------------------------------------------------
# broken checkpoints: named, and the previous complete one offered
# ---------------------------------------------------------------------------------------------------------


def _finite_weight_edit(path):
    from safetensors.torch import load_file, save_file

    weights = load_file(path)
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3  # still finite, same size
    save_file(weights, str(path), metadata={"format": "pt"})


DAMAGE = {
    "truncated weights": (
        lambda s: (s / "model.safetensors").write_bytes((s / "model.safetensors").read_bytes()[:100]),
        r"model.safetensors is truncated \(100 of",
    ),
    "finite weight change": (
        lambda s: _finite_weight_edit(s / "model.safetensors"),
        "model.safetensors does not match the checksum saved with it",
    ),
    "garbage state": (
        lambda s: (s / "trainer_state" / "state.pt").write_bytes(
            b"g" * (s / "trainer_state" / "state.pt").stat().st_size
        ),
        "trainer_state/state.pt does not match the checksum",
    ),
    "no tokenizer": (lambda s: (s / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    "no optimizer": (
        lambda s: (s / "trainer_state" / "optimizer.pt").unlink(),
        "trainer_state/optimizer.pt is missing",
    ),
    "edited config": (
        lambda s: (s / "config.json").write_text((s / "config.json").read_text().replace('"silu"', '"gelu"')),
        "config.json does not match",
    ),
    "torn manifest": (
        lambda s: (s / "trainer_state" / "manifest.json").write_text("{"),
        "trainer_state/manifest.json is unreadable",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_broken_last_checkpoint_is_named_and_the_previous_complete_one_offered(run, damage):
    harm, problem = DAMAGE[damage]
    harm(run / "checkpoints" / "step_000002")
    message = _refused(run, f"--resume: checkpoint '{run}/checkpoints/step_000002' is broken: {problem}")
    assert message.endswith("resume from step_000001 with --resume-from step_000001, or delete the broken checkpoint")


def test_the_offered_checkpoint_is_the_newest_complete_one(run):
    for step in ("step_000001", "step_000002"):
        (run / "checkpoints" / step / "model.safetensors").write_bytes(b"\0" * 64)
    _refused(run, "step_000002' is broken: .*; resume from step_000000 with --resume-from step_000000")
    (run / "checkpoints" / "step_000000" / "trainer_state" / "state.pt").unlink()
    _refused(run, "no earlier checkpoint is complete: start a new run with --overwrite")


def test_damaged_files_under_a_manifest_rewritten_to_match_are_named_when_loaded(run):
    """Whoever damages a checkpoint can rewrite its manifest to match: the loaders still name the damage."""
    step = run / "checkpoints" / "step_000002"

    def damaged(name: str, content: bytes) -> None:
        (step / name).write_bytes(content)
        ckpt.write_manifest(step)

    full = (step / "model.safetensors").read_bytes()
    damaged("model.safetensors", full[:1000])
    _refused(
        run,
        r"step_000002' is broken: model.safetensors is truncated .*; resume from step_000001 with --resume-from step_000001",
    )
    damaged("model.safetensors", full)
    damaged("trainer_state/state.pt", b"\x80\x04garbage")
    _refused(run, r"step_000002' is broken: trainer_state/state.pt cannot be read \(UnpicklingError")
    damaged("trainer_state/state.pt", (run / "checkpoints" / "step_000001" / "trainer_state" / "state.pt").read_bytes())
    _refused(run, r"step_000002' is broken: trainer_state/state.pt is the state of step 1, not of step 2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (step / name).unlink()
    ckpt.write_manifest(step)
    _refused(run, r"step_000002' is broken: there are no tokenizer files in it")


def test_a_broken_kl_reference_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    train(_cfg(out, **{"train.kl_coef": 0.01}))
    (out / "checkpoints" / "step_000000" / "model.safetensors").write_bytes(b"x" * 8)
    _refused(
        out,
        r"step_000000', the KL reference policy \(train.kl_coef > 0\), is broken: model.safetensors is truncated",
        cfg={"train.kl_coef": 0.01},
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_any_changed_byte_of_any_file_is_found(finished, tmp_path_factory, data):
    """Property: flipping any byte of any file the manifest lists makes :func:`checkpoint_problem` name that file."""
    step = tmp_path_factory.mktemp("c") / "step_000002"
    shutil.copytree(finished / "checkpoints" / "step_000002", step)
    names = sorted(p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file() and p.name != "manifest.json")
    name = data.draw(st.sampled_from(names))
    raw = bytearray((step / name).read_bytes())
    offset = data.draw(st.integers(0, len(raw) - 1))
    raw[offset] ^= data.draw(st.integers(1, 255))
    (step / name).write_bytes(bytes(raw))
    assert (
        ckpt.checkpoint_problem(step)
        == f"{name} does not match the checksum saved with it (its content changed after the save)"
    )


# ---------------------------------------------------------------------------------------------------------
# steps and --resume-from
# ---------------------------------------------------------------------------------------------------------


def test_steps_below_the_checkpoints_step_is_refused(run):
    _refused(
        run,
        r"steps: 1 is below step 2 of checkpoint '.*step_000002', where --resume continues; give --steps 2 or more",
        cfg={"steps": 1},
    )
    assert train(_cfg(run, steps=1), resume_from="1")["resumed_from_step"] == 1  # an earlier checkpoint may end there


def test_steps_equal_to_the_checkpoints_step_finishes_the_run(run):
    (run / "summary.json").unlink()
    summary = train(_cfg(run, steps=2), resume=True)
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 2 and (run / "summary.json").exists()


@pytest.mark.parametrize("spec", ["1", "step_000001", "checkpoints/step_000001"])
def test_resume_from_an_earlier_checkpoint_sets_the_later_ones_aside(run, monkeypatch, spec):
    monkeypatch.chdir(run)
    later = (run / "checkpoints" / "step_000002" / "model.safetensors").read_bytes()
    summary = train(_cfg(run, steps=2), resume_from=spec)
    assert summary["resumed_from_step"] == 1
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [0, 1, 2]
    superseded = run / "checkpoints" / "superseded"
    assert (superseded / "step_000002" / "model.safetensors").read_bytes() == later  # kept, not deleted
    assert [r["step"] for r in read_metrics(superseded / "metrics.jsonl")] == [0, 1, 2]  # the records as they were
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]
    assert ckpt.checkpoint_problem(run / "checkpoints" / "step_000002") is None


def test_resume_from_names_what_exists(run):
    _refused(
        run,
        r"--resume-from: no checkpoint 'step_000007' in .*; it holds \['step_000000', 'step_000001', 'step_000002'\]",
        resume_from="step_000007",
    )
    other = run.parent / "other" / "checkpoints" / "step_000001"
    other.mkdir(parents=True)
    _refused(run, "--resume-from: no checkpoint", resume_from=str(other))
    with pytest.raises(ConfigError, match="--overwrite: cannot be combined with --resume"):
        train(_cfg(run), resume_from="1", overwrite=True)


def test_resume_from_a_broken_earlier_checkpoint_offers_the_one_before(run):
    (run / "checkpoints" / "step_000001" / "model.safetensors").write_bytes(b"\0" * 10)
    _refused(
        run,
        r"step_000001' is broken: model.safetensors is truncated .*resume from step_000000 with --resume-from step_000000",
        resume_from="1",
    )


# ---------------------------------------------------------------------------------------------------------
# full disk during a save
# ---------------------------------------------------------------------------------------------------------

SAFETENSORS_FULL = (
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


class FillingFile:
    """A file on a disk with ``left`` bytes free: a write past them raises ENOSPC, as a full disk's does."""

    def __init__(self, handle, left: int):
        self.handle, self.left = handle, left

    def write(self, data):
        if len(data) > self.left:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.left -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


@pytest.mark.parametrize("where", ["weights", "optimizer"])
def test_a_full_disk_during_a_save_leaves_no_partial_checkpoint(tmp_path, monkeypatch, where):
    import errno

    from safetensors import SafetensorError

    out = tmp_path / "run"
    train(_cfg(out, steps=1))
    if where == "weights":  # what safetensors raises on ENOSPC

        def fail(*args, **kwargs):
            raise SafetensorError(SAFETENSORS_FULL)

        monkeypatch.setattr("transformers.modeling_utils.safe_save_file", fail)
    else:  # the optimizer state is written through a Python file: the OS error itself
        real_open = open

        def full_open(path, mode="r", *args, **kwargs):
            handle = real_open(path, mode, *args, **kwargs)
            return FillingFile(handle, 0) if str(path).endswith("optimizer.pt") and "w" in mode else handle

        monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(OSError) as err:
        train(_cfg(out, steps=2), resume=True)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(out / "checkpoints" / "step_000002.tmp")
    assert err.value.advice == (
        "the checkpoint of step 2 was not written and its partial files were removed; free some space, then continue from step 1 with --resume"
    )
    assert [p.name for p in (out / "checkpoints").iterdir()] and not (out / "checkpoints" / "step_000002.tmp").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000000", "step_000001"]
    assert train(_cfg(out, steps=2), resume=True)["resumed_from_step"] == 1  # once there is space


def test_the_cli_prints_the_full_disk_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from adora_openrlhf import train as train_cli
    from adora_openrlhf.backends.local import trainer

    def full(cfg, **kwargs):
        err = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "checkpoints" / "step_000004.tmp"))
        err.advice = "the checkpoint of step 4 was not written and its partial files were removed; free some space, then continue from step 3 with --resume"
        raise err

    monkeypatch.setattr(trainer, "train", full)
    assert train_cli.main(["--output-dir", str(tmp_path), "--recipe", "kk-tiny"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"error: {tmp_path}/checkpoints/step_000004.tmp: No space left on device (free some space); the checkpoint of step 4 was not written "
        "and its partial files were removed; free some space, then continue from step 3 with --resume"
    )


def test_disk_full_is_recognised_however_the_library_words_it():
    import errno

    assert ckpt.is_disk_full(OSError(errno.ENOSPC, "x"))
    assert ckpt.is_disk_full(OSError(errno.EDQUOT, "x"))
    assert ckpt.is_disk_full(RuntimeError(SAFETENSORS_FULL))
    assert ckpt.is_disk_full(RuntimeError("failed to write: No space left on device (os error 28)"))
    assert not ckpt.is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"))
    assert not ckpt.is_disk_full(OSError(errno.EACCES, "Permission denied"))


# ---------------------------------------------------------------------------------------------------------
# safetensors headers
# ---------------------------------------------------------------------------------------------------------


def _safetensors(path, tensors=None):
    from safetensors.torch import save_file

    save_file(tensors or {"a": torch.zeros(3, dtype=torch.float32), "b": torch.ones(2, dtype=torch.int64)}, str(path))
    return path.read_bytes()


def test_safetensors_size_is_header_plus_data(tmp_path):
    """Hand case: a (3,) float32 and a (2,) int64 tensor hold 12 + 16 = 28 data bytes after 8 + N header bytes."""
    raw = _safetensors(tmp_path / "m.safetensors")
    (header_len,) = struct.unpack("<Q", raw[:8])
    assert len(raw) == 8 + header_len + 28
    assert safetensors_problem(tmp_path / "m.safetensors") is None
    (tmp_path / "m.safetensors").write_bytes(raw + b"\0")
    assert (
        safetensors_problem(tmp_path / "m.safetensors")
        == "m.safetensors has 1 bytes more than its header describes (damaged)"
    )
    (tmp_path / "m.safetensors").write_bytes(raw[:4])
    assert safetensors_problem(tmp_path / "m.safetensors") == "m.safetensors is truncated (4 bytes, not even a header)"
    (tmp_path / "m.safetensors").write_bytes(raw[:8] + b"{not json" + raw[17:])
    assert (
        safetensors_problem(tmp_path / "m.safetensors")
        == "m.safetensors is not a readable safetensors file (its header is damaged)"
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10_000))
def test_property_every_truncation_of_a_weights_file_is_found(tmp_path, cut):
    path = tmp_path / "model.safetensors"
    raw = _safetensors(path, {"w": torch.arange(40, dtype=torch.float32).reshape(5, 8)})
    cut = cut % len(raw)
    path.write_bytes(raw[:cut])
    problem = weight_files_problem(tmp_path)
    assert problem is not None and problem.startswith("model.safetensors is truncated")
    path.write_bytes(raw)


def test_sharded_weights_with_a_missing_shard(tmp_path):
    _safetensors(tmp_path / "model-00001-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    assert (
        weight_files_problem(tmp_path)
        == "model-00002-of-00002.safetensors (a shard model.safetensors.index.json names) is missing"
    )


# ---------------------------------------------------------------------------------------------------------
# --model: weights, tokenizer and vocabulary that do not fit
# ---------------------------------------------------------------------------------------------------------


def _model_copy(finished, tmp_path, name, edit_config=None):
    model = tmp_path / name
    shutil.copytree(finished / "final_model", model)
    if edit_config is not None:
        config = json.loads((model / "config.json").read_text())
        edit_config(config)
        (model / "config.json").write_text(json.dumps(config))
    return model


def _as_llama(c):
    c.update(model_type="llama", architectures=["LlamaForCausalLM"])


def _as_gpt2(c):
    c.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=16, n_head=2, n_layer=1)


def _wider(c):
    c.update(intermediate_size=64)


@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            _as_llama,
            "do not fit the LlamaForCausalLM its config.json describes: 3 weights the model has no parameter for",
        ),
        (_as_gpt2, "do not fit the GPT2LMHeadModel its config.json describes: 17 parameters missing from the weights"),
        (_wider, "have other shapes than its config.json describes"),
    ],
)
def test_model_weights_that_do_not_fit_the_config_are_refused(finished, tmp_path, edit, needle):
    model = _model_copy(finished, tmp_path, "model", edit)
    with pytest.raises(ConfigError, match=f"model.path: the weights in '{model}' {needle}"):
        train(_cfg(tmp_path / "out", **{"model.path": str(model)}))
    assert not (tmp_path / "out").exists()


def test_model_without_tokenizer_or_with_a_larger_tokenizer_is_refused(finished, tmp_path):
    from transformers import AutoTokenizer

    bare = _model_copy(finished, tmp_path, "bare")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    with pytest.raises(ConfigError, match=f"model.path: '{bare}': there are no tokenizer files in it"):
        train(_cfg(tmp_path / "out", **{"model.path": str(bare)}))
    big = _model_copy(finished, tmp_path, "big")
    tokenizer = AutoTokenizer.from_pretrained(str(big))
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(20)])
    tokenizer.save_pretrained(str(big))
    with pytest.raises(
        ConfigError,
        match=f"model.path: '{big}': the tokenizer has token ids up to 319, but the model's embedding has 300 rows",
    ):
        train(_cfg(tmp_path / "out", **{"model.path": str(big)}))
    truncated = _model_copy(finished, tmp_path, "truncated")
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:500])
    with pytest.raises(
        ConfigError,
        match=f"model.path: '{truncated}' cannot be loaded: model.safetensors is truncated .*; re-download or re-export",
    ):
        train(_cfg(tmp_path / "out", **{"model.path": str(truncated)}))
    assert not (tmp_path / "out").exists()


def test_run_directory_check_order_is_read_only(run):
    """check_previous_run verifies without writing; the re-check under the lock skips the checksums."""
    before = snapshot(run)
    cfg = _cfg(run, steps=3)
    assert rundir.check_previous_run(run, cfg, True, False) == run / "checkpoints" / "step_000002"
    assert rundir.check_previous_run(run, cfg, True, False, verify_files=False) == run / "checkpoints" / "step_000002"
    assert snapshot(run) == before


def test_torch_save_on_a_full_disk_raises_the_os_error_naming_the_file(tmp_path, monkeypatch):
    """torch's archive writer turns a failed write into "unexpected pos"; the checkpoint's writer gives ENOSPC and the path."""
    import errno

    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda path, mode="r", *a, **k: FillingFile(real_open(path, mode, *a, **k), 1000)
    )
    target = tmp_path / "state.pt"
    with pytest.raises(OSError) as err:
        ckpt._torch_save({"x": torch.zeros(10_000)}, target)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target) and ckpt.is_disk_full(err.value)
    assert "unexpected pos" in str(err.value.__cause__)  # what torch itself said


def test_torch_save_on_a_real_full_file_system(tmp_path):
    """The same on a 64 KiB tmpfs (needs the right to mount; skipped elsewhere)."""
    import errno
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(OSError) as err:
            ckpt._torch_save({"x": torch.zeros(100_000)}, mount / "optimizer.pt")
        assert err.value.errno == errno.ENOSPC and err.value.filename == str(mount / "optimizer.pt")
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
