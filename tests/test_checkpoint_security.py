"""Nothing in a checkpoint runs code on --resume: crafted pickles in every file a resume unpickles, with and without a
manifest rewritten to match them, are refused with one line naming the file; a checkpoint whose manifest was deleted
is refused; the trainer state itself is plain data."""

import io
import pickle
import sys
from pathlib import Path

import pytest
import torch

from adora_openrlhf.backends.local.trainer import train
from adora_openrlhf.config import ConfigError
from adora_openrlhf.rundir import checkpoints as ckpt

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_runs import tiny_kk_config


class _Payload:
    """Unpickling this writes a marker file: the proof that a load ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _crafted(path: Path, marker: Path, inside_torch_file: bool) -> None:
    """Replace ``path`` by a torch file (or a plain pickle) holding the payload beside what it held."""
    if inside_torch_file:
        buffer = io.BytesIO()
        torch.save({"step": 2, "payload": _Payload(marker)}, buffer)
        path.write_bytes(buffer.getvalue())
    else:
        path.write_bytes(pickle.dumps({"step": 2, "payload": _Payload(marker)}))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("security") / "run"
    train(tiny_kk_config(out, steps=2, save_every=1))
    return out


def _copy_run(finished_run: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


@pytest.mark.parametrize("name", ["state.pt", "optimizer.pt"])
@pytest.mark.parametrize("rewrite_manifest", [False, True])
@pytest.mark.parametrize("inside_torch_file", [False, True])
def test_crafted_pickle_runs_no_code_on_resume(finished_run, tmp_path, name, rewrite_manifest, inside_torch_file):
    out = _copy_run(finished_run, tmp_path)
    marker = tmp_path / "code-ran"
    step = out / "checkpoints" / "step_000002"
    _crafted(step / ckpt.STATE_DIR / name, marker, inside_torch_file)
    if rewrite_manifest:  # whoever crafts the file can rewrite the manifest to match it
        ckpt.write_manifest(step)
    for resume_from in (None, "step_000002"):
        with pytest.raises(ConfigError) as err:
            train(tiny_kk_config(out, steps=3, save_every=1), resume=True, resume_from=resume_from)
        message = str(err.value)
        assert name in message and "\n" not in message
        if rewrite_manifest:
            assert "not loaded" in message or "cannot be read" in message
    assert not marker.exists(), "loading the checkpoint ran code"


def test_load_trainer_state_refuses_objects_directly(finished_run, tmp_path):
    out = _copy_run(finished_run, tmp_path)
    marker = tmp_path / "code-ran"
    step = out / "checkpoints" / "step_000001"
    _crafted(step / ckpt.STATE_DIR / "state.pt", marker, inside_torch_file=True)
    with pytest.raises(ConfigError, match="state.pt holds objects other than tensors"):
        ckpt.load_trainer_state(step)
    assert not marker.exists()


def test_a_deleted_manifest_is_refused(finished_run, tmp_path):
    out = _copy_run(finished_run, tmp_path)
    step = out / "checkpoints" / "step_000002"
    (step / ckpt.STATE_DIR / ckpt.MANIFEST_FILE).unlink()
    weights = step / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # bit rot in the weights, which only the manifest would show
    weights.write_bytes(bytes(data))
    assert ckpt.checkpoint_problem(step) == "trainer_state/manifest.json is missing"
    with pytest.raises(
        ConfigError,
        match=r"^--resume: checkpoint '.*step_000002' is broken: trainer_state/manifest.json is missing; resume from "
        "step_000001 with --resume-from step_000001",
    ):
        train(tiny_kk_config(out, steps=3, save_every=1), resume=True)


def test_trainer_state_is_plain_data(finished_run):
    state_file = finished_run / "checkpoints" / "step_000002" / ckpt.STATE_DIR / "state.pt"
    raw = torch.load(state_file, weights_only=True)  # raises on anything but tensors, numbers, strings, containers
    assert raw["step"] == 2 and isinstance(raw["rng"]["numpy"][1], list)
    state = ckpt.load_trainer_state(state_file.parent.parent)
    ckpt.restore_rng(state.rng)  # the NumPy state round-trips through plain lists


@pytest.mark.parametrize(
    ("allocation", "field"),
    [
        (
            {"posteriors": [["p1", 2.0, 1.0, 3], ["p2", float("nan"), 1.0, 2]]},
            r"posteriors\[1\]: a must be a finite number > 0",
        ),
        ({"posteriors": [["p1", 2.0, float("inf"), 3]]}, r"posteriors\[0\]: b must be a finite number > 0"),
        ({"posteriors": [["p1", -4.0, 1.0, 3]]}, r"posteriors\[0\]: a must be a finite number > 0"),
        ({"posteriors": [["p1", 2.0, 1.0, -1]]}, r"posteriors\[0\]: observations must be an integer >= 0"),
        ({"posteriors": [["p1", 2.0, 1.0]]}, r"posteriors\[0\]: expected \[key, a, b, observations\]"),
        ({"posteriors": "p1"}, r"posteriors must be a list, got str"),
    ],
)
def test_a_damaged_allocation_store_is_refused_naming_the_file_and_entry(finished_run, tmp_path, allocation, field):
    """A checkpoint's allocation store with NaN, inf or negative counts, or entries of the wrong shape, is refused
    on --resume even when the manifest was rewritten to match the edited file."""
    out = _copy_run(finished_run, tmp_path)
    step = out / "checkpoints" / "step_000002"
    state_file = step / ckpt.STATE_DIR / "state.pt"
    state = torch.load(state_file, weights_only=True)
    state["allocation"] = allocation
    torch.save(state, state_file)
    ckpt.write_manifest(step)
    with pytest.raises(
        ConfigError, match=rf"checkpoint .*step_000002' is broken: trainer_state/state.pt: allocation store: {field}"
    ):
        ckpt.load_trainer_state(step)


@pytest.mark.parametrize("target", ["checkpoints/step_000002", "final_model"])
def test_eval_run_refuses_swapped_weights_as_resume_does(finished_run, tmp_path, capsys, target):
    """A checkpoint or final_model whose model.safetensors holds other weights (same size, manifest left as it
    was) is refused by eval.run, naming the file, as --resume refuses it; untouched, both evaluate."""
    from adora_openrlhf.evaluation.run import main as eval_main

    out = _copy_run(finished_run, tmp_path)
    model = out / target
    assert (model / ("trainer_state/manifest.json" if "step" in target else "manifest.json")).is_file()
    assert ckpt.model_files_problem(model) is None
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # another model's last weights, same size (the header, naming shapes, is unchanged)
    weights.write_bytes(bytes(data))
    argv = ["--run", str(out), "--model", str(model), "--temperature", "0", "--k", "1", "--engine", "hf"]
    assert eval_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--model: {model}: model.safetensors does not match the checksum saved with it" in err


def test_checkpoints_without_manifest_and_run_json_are_refused(finished_run, tmp_path):
    """Deleting both files from every checkpoint of the run does not make them pass: each is broken."""
    out = _copy_run(finished_run, tmp_path)
    for step in (out / "checkpoints").glob("step_*"):
        for name in (ckpt.MANIFEST_FILE, ckpt.RUN_FILE):
            (step / ckpt.STATE_DIR / name).unlink()
        assert ckpt.checkpoint_problem(step) == "trainer_state/manifest.json is missing"
        assert ckpt.model_files_problem(step) == "trainer_state/manifest.json is missing"  # eval.run --model too
    with pytest.raises(
        ConfigError,
        match=r"step_000002' is broken: trainer_state/manifest.json is missing; no earlier checkpoint is complete",
    ):
        train(tiny_kk_config(out, steps=3, save_every=1), resume=True)


def test_a_truncated_tokenizer_json_is_named_as_the_file(finished_run, tmp_path, capsys):
    """A model directory whose tokenizer.json was cut short: the trainer (model.path) and eval.run name the file."""
    import shutil

    from adora_openrlhf.evaluation.run import main as eval_main

    model = tmp_path / "model"
    shutil.copytree(finished_run / "final_model", model)
    (model / "manifest.json").unlink()  # a model from elsewhere: no manifest to catch it
    text = (model / "tokenizer.json").read_text()
    (model / "tokenizer.json").write_text(text[: len(text) // 2])
    cfg = tiny_kk_config(tmp_path / "run", steps=1, **{"model.path": str(model)})
    with pytest.raises(
        ConfigError, match=r"^model.path: .*cannot be loaded: tokenizer.json is not valid JSON \(.*line \d+ column"
    ):
        train(cfg)
    assert not (tmp_path / "run").exists()
    assert (
        eval_main(
            ["--model", str(model), "--bench", "kk", "--k", "1", "--temperature", "0", "--out", str(tmp_path / "e")]
        )
        == 2
    )
    assert f"--model: {model}: tokenizer.json is not valid JSON" in capsys.readouterr().err
