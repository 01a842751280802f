"""The vision-language path of the local backend: the PIL task generator, the tiny Qwen2.5-VL and its processor,
image inputs through rollout and update, a short RL run with resume, and ADORA's difficulty rule on real rollouts."""

from __future__ import annotations

import json
import shutil
from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.algorithms.adora import TAS, TDS, classify_groups
from adora_openrlhf.algorithms.sampling import AdaptiveSampler
from adora_openrlhf.backends.local.update import pack, token_log_probs
from adora_openrlhf.config import (
    AdaptiveSamplingConfig,
    AdoraConfig,
    ConfigError,
    SamplingParams,
    TinyModelConfig,
    TinyVisionConfig,
)
from adora_openrlhf.data_prep import geo_synth as geo_synth_files
from adora_openrlhf.engine import vlm
from adora_openrlhf.engine.rollout import GenerationSettings, RolloutEngine, generate_responses, make_reward_fns
from adora_openrlhf.engine.tokenization import train_bpe_tokenizer
from adora_openrlhf.recipes import build_run_config
from adora_openrlhf.rewards.base import get_reward_fn
from adora_openrlhf.rows import Row, validate_rows
from adora_openrlhf.tasks import geo_synth

TEXT = TinyModelConfig(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)
VISION = TinyVisionConfig(image_size=32, patch_size=8, depth=1, hidden_size=16, intermediate_size=32, num_heads=2)


# ---------------------------------------------------------------------------------------------------------
# The generator: labels recounted from the pixels, reproducible images
# ---------------------------------------------------------------------------------------------------------


def regions(image, colour) -> list[tuple[int, int, int]]:
    """(pixel area, box height, box width) of each 4-connected region of exactly ``colour`` (flood fill)."""
    pixels = np.asarray(image)
    hit = np.all(pixels == np.array(colour, dtype=pixels.dtype), axis=-1)
    seen = np.zeros_like(hit)
    found = []
    for y, x in zip(*np.nonzero(hit), strict=True):
        if seen[y, x]:
            continue
        queue, cells = deque([(y, x)]), []
        seen[y, x] = True
        while queue:
            cy, cx = queue.popleft()
            cells.append((cy, cx))
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < hit.shape[0] and 0 <= nx < hit.shape[1] and hit[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        ys, xs = [c[0] for c in cells], [c[1] for c in cells]
        found.append((len(cells), max(ys) - min(ys) + 1, max(xs) - min(xs) + 1))
    return found


def components(image, colour) -> list[int]:
    """Pixel areas of the 4-connected regions of exactly ``colour``."""
    return [area for area, _, _ in regions(image, colour)]


def kind_of(area: int, height: int, width: int) -> str:
    """A region's shape kind from the share of its bounding box it fills: square 1, circle ~pi/4, triangle ~1/2."""
    fill = area / (height * width)
    return "square" if fill > 0.95 else "circle" if fill > 0.66 else "triangle"


def answer_from_pixels(row) -> str:
    """The answer to ``row``'s question computed from its image alone."""
    image, meta, prompt = row["images"][0], row["meta"], row["prompt"]
    areas = {c: components(image, rgb) for c, rgb in geo_synth.COLOURS.items()}
    if meta["task"] == "count":
        colour = next(c for c in geo_synth.COLOURS if f"many {c} " in prompt)
        return str(len(areas[colour]))
    if meta["task"] == "most":
        return max(meta["choices"], key=lambda c: len(areas[c]))
    if meta["task"] == "colour":
        kind = next(k for k in geo_synth.KINDS if f"the {k}?" in prompt)
        (colour,) = [
            c for c, rgb in geo_synth.COLOURS.items() for region in regions(image, rgb) if kind_of(*region) == kind
        ]
        return colour
    first, second = meta["choices"]
    return first if max(areas[first]) > max(areas[second]) else second


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000), task=st.sampled_from(sorted(geo_synth.TASKS)), level=st.sampled_from(geo_synth.LEVELS)
)
def test_generated_labels_are_right_by_construction(seed, task, level):
    (row,) = geo_synth.generate_rows(1, seed, [task], [level])
    assert answer_from_pixels(row) == row["label"]
    if row["meta"]["question_type"] == "multi_choice":
        assert (
            row["label"] in row["meta"]["choices"]
            and row["meta"]["choices"][ord(row["meta"]["answer_letter"]) - 65] == row["label"]
        )
    demo = get_reward_fn(row["source"])(row["meta"]["solution_text"], row["label"], row["meta"])
    assert demo.correct and demo.reward == pytest.approx(1.0)  # the demonstration earns the full reward


def test_config_knows_every_question_kind():
    for kind in geo_synth.TASKS:  # every registered question kind is a valid data.geo.tasks entry
        assert geo_synth.GeoDataConfig(tasks=[kind]).tasks == [kind]
    assert build_run_config("geo-tiny", {"data.geo.tasks": ["colour"]}).data.geo.tasks == ["colour"]
    with pytest.raises(ConfigError, match="data.geo.tasks"):
        build_run_config("geo-tiny", {"data.geo.tasks": ["shade"]})


def test_colour_question_has_one_shape_of_the_asked_kind():
    for level in geo_synth.LEVELS:
        for row in geo_synth.generate_rows(20, level, ["colour"], [level]):
            kinds = [s[0] for s in row["meta"]["shapes"]]
            asked = row["prompt"].split("the ")[-1].split("?")[0]
            assert len(kinds) == level and kinds.count(asked) == 1
            assert row["meta"]["choices"] == list(geo_synth.COLOURS)


def test_read_and_guess_demonstrations_and_their_probe():
    import random

    from adora_openrlhf.tasks.behaviours import RANDOMISED_DEMONSTRATIONS, demonstration_for, style_fractions

    colour, count = validate_rows(
        geo_synth.generate_rows(1, 5, ["colour"], [3]) + geo_synth.generate_rows(1, 5, ["count"], [2]),
        "generated",
        "geometry",
    )
    for row in (colour, count):
        read = demonstration_for(row, "read")
        assert read == demonstration_for(row, "direct") == row.meta["solution_text"]
        assert geo_synth.response_style(read) == "read"
    rng = random.Random(0)
    guesses = [demonstration_for(colour, "guess", rng) for _ in range(400)]
    assert {geo_synth.response_style(g) for g in guesses} == {"guess"}
    answers = [g.split("<answer>")[1].split("</answer>")[0] for g in guesses]
    assert set(answers) == set(geo_synth.COLOURS)  # uniform over the choices, whatever the image shows
    assert all(80 <= answers.count(c) <= 120 for c in geo_synth.COLOURS)
    counts = {demonstration_for(count, "guess", rng).split("<answer>")[1][0] for _ in range(200)}
    assert counts == {str(n) for n in range(geo_synth.MAX_GUESSED_COUNT + 1)}
    assert ("geo_synth", "guess") in RANDOMISED_DEMONSTRATIONS and (
        "geo_synth",
        "read",
    ) not in RANDOMISED_DEMONSTRATIONS
    assert geo_synth.response_style("<think>reddish</think><answer>red</answer>") == "other"
    assert geo_synth.response_style("<answer>red</answer>") == "other"
    texts = [guesses[0], colour.meta["solution_text"], "no think", guesses[1]]
    assert style_fractions(["geo_synth"] * 4, texts, "r/") == {
        "r/guess_fraction": 0.5,
        "r/read_fraction": 0.25,
        "r/other_fraction": 0.25,
    }


def test_generator_is_reproducible_and_splits_are_disjoint(tmp_path):
    a, b = geo_synth.generate_rows(12, 3), geo_synth.generate_rows(12, 3)
    assert [r["images"][0].tobytes() for r in a] == [r["images"][0].tobytes() for r in b]
    assert [r["prompt"] for r in a] == [r["prompt"] for r in b]
    assert [r["images"][0].tobytes() for r in geo_synth.generate_rows(12, 4)] != [r["images"][0].tobytes() for r in a]
    train, held = geo_synth.generate_splits(60, 20, 0)
    assert len(train) == 60 and len(held) == 20
    assert not {json.dumps(r["meta"]["shapes"]) for r in train} & {json.dumps(r["meta"]["shapes"]) for r in held}
    assert {r["meta"]["difficulty"] for r in train} == {1, 2, 3, 4} and {r["meta"]["task"] for r in train} == set(
        geo_synth.TASKS
    )
    path = geo_synth_files.write_split(held, tmp_path, "test")  # the JSONL + PNG files read back pixel for pixel
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert vlm.load_image(rows[0]["images"][0]).tobytes() == held[0]["images"][0].tobytes()
    assert json.loads(rows[0]["reward_label"])["source"] == "geo_synth"
    assert validate_rows(rows, "test.jsonl", "geometry")[0].images == (rows[0]["images"][0],)


def test_generator_cli_errors(capsys):
    with pytest.raises(SystemExit):
        geo_synth_files.main(["--out", "/tmp/unused", "--tasks", "count,nope"])
    assert "unknown question kind(s) ['nope']" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# Tiny Qwen2.5-VL and processor
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rows():
    return geo_synth.generate_rows(6, 0)


@pytest.fixture(scope="module")
def tiny(rows, tmp_path_factory):
    tokenizer = train_bpe_tokenizer(
        [r["prompt"] for r in rows] + [r["meta"]["solution_text"] for r in rows], TEXT.vocab_size
    )
    processor = vlm.build_tiny_processor(tokenizer, VISION)
    model = vlm.build_tiny_vlm(TEXT, VISION, tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tiny_vlm")
    model.save_pretrained(str(path))
    processor.save_pretrained(str(path))
    return processor, model, path


def encode(processor, rows, template="auto"):
    texts = [vlm.render_vlm_prompt(r["prompt"], processor, template) for r in rows]
    return vlm.encode_vlm_prompts(processor, texts, [r["images"] for r in rows], 256, "test")


def test_processor_round_trip(tiny, rows):
    processor, _, path = tiny
    loaded = vlm.load_processor(str(path))
    assert vlm.is_vlm_checkpoint(str(path))
    assert json.loads((path / "processor_config.json").read_text())["processor_class"] == "Qwen2_5_VLProcessor"
    ids, extras = encode(processor, rows)
    ids2, extras2 = encode(loaded, rows)
    assert ids == ids2 and all(
        torch.equal(a[k], b[k]) for a, b in zip(extras, extras2, strict=True) for k in vlm.EXTRA_INPUT_KEYS
    )
    import pickle  # the processor class is made on first use and still pickles by name (worker processes)

    assert type(pickle.loads(pickle.dumps(loaded))) is type(loaded) is vlm.ImageOnlyQwen2_5_VLProcessor
    # a 32x32 image, 8-pixel patches: a 4x4 grid, merged 2x2 -> 4 image tokens between the vision start/end tokens
    assert extras[0]["image_grid_thw"].tolist() == [[1, 4, 4]] and tuple(extras[0]["pixel_values"].shape) == (
        16,
        3 * 2 * 8 * 8,
    )
    image_id = loaded.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert ids[0].count(image_id) == 4
    text = loaded.tokenizer.decode(ids[0])
    assert (
        text
        == vlm.IMAGE_BLOCK.replace("<|image_pad|>", "<|image_pad|>" * 4)
        + rows[0]["prompt"].replace("<image>", "")
        + "\n"
    )
    # the tiny chat template (used by `auto` and by OpenRLHF's apply_chat_template) gives the compact text
    assert [vlm.render_vlm_prompt(r["prompt"], processor, "chat") for r in rows] == [
        vlm.render_vlm_prompt(r["prompt"], processor, "compact") for r in rows
    ]


def test_model_round_trip_through_from_pretrained(tiny, rows):
    processor, model, path = tiny
    loaded = vlm.load_vlm(str(path))
    assert type(loaded).__name__ == "Qwen2_5_VLForConditionalGeneration"
    ids, extras = encode(processor, rows[:2])
    batch = pack(ids, [[5, 6, 7]] * 2, processor.tokenizer.pad_token_id, extras)
    with torch.no_grad():
        assert torch.allclose(token_log_probs(model, batch), token_log_probs(loaded, batch), atol=1e-6)


def test_image_count_mismatch_and_missing_file_are_named(tiny, rows, tmp_path):
    processor, _, _ = tiny
    with pytest.raises(ConfigError, match=r"eval:1: field 'images': 2 image\(s\) for 1 image slot"):
        vlm.encode_vlm_prompts(
            processor,
            [vlm.render_vlm_prompt(rows[0]["prompt"], processor, "compact")],
            [rows[0]["images"] * 2],
            256,
            "eval",
        )
    with pytest.raises(ConfigError, match=r"f.jsonl:1: field 'images\[0\]': no image file at"):
        validate_rows(
            [{"prompt": "<image>x", "label": "1", "images": [str(tmp_path / "missing.png")]}], "f.jsonl", "geometry"
        )


def test_rollout_log_probs_match_training_forward_with_images(tiny, rows):
    """Left-padded generation with pixel inputs and right-padded training (M-RoPE positions from the image
    tokens in both) give the same token log-probs."""
    processor, model, _ = tiny
    ids, extras = encode(processor, rows[:3])
    ids[1] = ids[1] + ids[1][-3:]  # different prompt lengths: real left padding
    width = max(map(len, ids))
    pad = processor.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    torch.manual_seed(0)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        do_sample=True,
        top_k=0,
        max_new_tokens=5,
        min_new_tokens=5,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=pad,
        eos_token_id=None,
        suppress_tokens=vlm.vision_token_ids(model),
        **vlm.extra_model_inputs(model, input_ids, extras),
    )
    resp = out.sequences[:, width:]
    gen_lp = torch.stack(
        [
            torch.log_softmax(step_logits, -1).gather(-1, resp[:, i : i + 1]).squeeze(-1)
            for i, step_logits in enumerate(out.logits)
        ],
        1,
    )
    with torch.no_grad():
        lp = token_log_probs(model, pack(ids, resp.tolist(), pad, extras))
        # without the image inputs the positions differ
        text_only = token_log_probs(model, pack(ids, resp.tolist(), pad))
    for i, p in enumerate(ids):
        assert torch.allclose(gen_lp[i], lp[i, len(p) - 1 : len(p) + 4], atol=1e-5)
    assert not torch.allclose(lp, text_only, atol=1e-3)


def test_generation_never_samples_vision_tokens(tiny, rows):
    processor, model, _ = tiny
    ids, extras = encode(processor, rows)
    torch.manual_seed(0)
    outs = generate_responses(
        model, processor.tokenizer, ids * 4, SamplingParams(temperature=2.0, max_new_tokens=12), 8, extras=extras * 4
    )
    banned = set(vlm.vision_token_ids(model))
    assert all(not banned & set(r) for r, _ in outs)


def test_growing_kv_cache_gives_the_default_caches_tokens_with_images(tiny, rows):
    processor, model, _ = tiny
    ids, extras = encode(processor, rows)
    outputs = {}
    for kv_cache in ("growing", "dynamic"):
        torch.manual_seed(3)
        outputs[kv_cache] = generate_responses(
            model,
            processor.tokenizer,
            ids,
            SamplingParams(temperature=1.0, max_new_tokens=80),
            4,
            extras=extras,
            kv_cache=kv_cache,
        )
    assert outputs["growing"] == outputs["dynamic"]


def test_warmup_step_trains_the_vision_tower(tiny, rows):
    """The warm-up forward gets each row's own pixels (swapping images changes the log-probs) and one warm-up
    step moves the vision tower's weights (patch embedding, blocks, merger)."""
    import copy

    from adora_openrlhf.backends.local.sft import supervised_warmup
    from adora_openrlhf.config import WarmupConfig

    processor, model, _ = tiny
    model = copy.deepcopy(model)
    tok = processor.tokenizer
    ids, extras = encode(processor, rows)
    demos = [tok(r["meta"]["solution_text"], add_special_tokens=False)["input_ids"] for r in rows]
    with torch.no_grad():
        own = token_log_probs(model, pack(ids, demos, tok.pad_token_id, extras))
        swapped = token_log_probs(model, pack(ids, demos, tok.pad_token_id, extras[1:] + extras[:1]))
    assert not torch.allclose(own, swapped, atol=1e-4)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("model.visual.")}
    row_objs = [
        Row(prompt=r["prompt"], label=r["label"], images=tuple(r["images"]), source=r["source"], meta=r["meta"])
        for r in rows
    ]
    supervised_warmup(model, tok, ids, row_objs, WarmupConfig(steps=1, lr=1e-3, batch_size=len(rows)), 0, 3, extras)
    moved = {n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])}
    for part in ("patch_embed", "blocks.0.attn", "blocks.0.mlp", "merger.mlp"):
        assert any(part in n for n in moved), part


def test_freeze_visual_encoder_trains_the_language_model_only(tiny, rows):
    """OpenRLHF's --actor.freeze_visual_encoder rule: everything outside language_model.* and lm_head.* (vision
    encoder and merger) keeps its weights through a warm-up step; the language model moves."""
    import copy

    from adora_openrlhf.backends.local.sft import supervised_warmup
    from adora_openrlhf.config import WarmupConfig

    processor, model, _ = tiny
    model = copy.deepcopy(model)
    tok = processor.tokenizer
    vision = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.visual."))
    assert vlm.freeze_visual_encoder(model) == vision > 0
    ids, extras = encode(processor, rows)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    row_objs = [
        Row(prompt=r["prompt"], label=r["label"], images=tuple(r["images"]), source=r["source"], meta=r["meta"])
        for r in rows
    ]
    supervised_warmup(model, tok, ids, row_objs, WarmupConfig(steps=1, lr=1e-3, batch_size=len(rows)), 0, 3, extras)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("language_model" in n or "lm_head" in n for n in moved)
    assert any(".layers.0." in n for n in moved)


def test_freeze_visual_encoder_config_and_flags():
    from adora_openrlhf.recipes import build_run_config

    with pytest.raises(
        ConfigError,
        match=r"^model.freeze_visual_encoder: applies to vision-language models \(an image task such as geometry\)",
    ):
        build_run_config("kk-tiny", {"model.freeze_visual_encoder": True})
    with pytest.raises(ConfigError, match=r"^model.freeze_visual_encoder: the model has no language_model"):
        vlm.freeze_visual_encoder(torch.nn.Linear(2, 2))
    flags = pytest.importorskip("adora_openrlhf.backends.openrlhf.flags")
    on = flags.derived_flags(build_run_config("geo3k-qwen2.5vl-7b-adora", {"model.freeze_visual_encoder": True}))
    assert on["actor.freeze_visual_encoder"] is True
    assert "actor.freeze_visual_encoder" not in flags.derived_flags(build_run_config("geo3k-qwen2.5vl-7b-adora"))
    pytest.importorskip("openrlhf")
    from adora_openrlhf.backends.openrlhf import launcher

    _, args, cfg = launcher.prepare(build_run_config("geo3k-qwen2.5vl-7b-adora", {"model.freeze_visual_encoder": True}))
    assert args.actor.freeze_visual_encoder is True and cfg.model.freeze_visual_encoder is True


def test_difficulty_rule_classes_on_real_rollouts(tiny, rows):
    """Groups sampled from the tiny VLM through the rollout engine and the sampler, graded by the geometry
    reward: TAS exactly when 0 < p <= tau. A random-init policy is never right, so groups 1.. are graded
    against the answer of their own first response (p >= 1/n there) and group 0 against its true label."""
    from adora_openrlhf.rewards.geometry import extract_final_answer

    processor, model, _ = tiny
    schema_rows = [Row(r["prompt"], r["label"], r["source"], r["meta"], tuple(r["images"])) for r in rows]
    ids, extras = encode(processor, rows)
    engine = RolloutEngine(
        model,
        processor.tokenizer,
        ids,
        schema_rows,
        make_reward_fns(schema_rows),
        0.5,
        GenerationSettings(64),
        extras=extras,
    )
    torch.manual_seed(1)
    sampler = AdaptiveSampler(
        AdaptiveSamplingConfig(n_keep=4), SamplingParams(temperature=1.5, max_new_tokens=6), seed=0
    )
    groups = sampler.sample(len(rows), engine.generate_fn(list(range(len(rows))))).groups
    reward = get_reward_fn("geo_synth")
    free = {"question_type": "free_form", "answer_type": "text"}
    correct = []
    for k, g in enumerate(groups):
        texts = [r.payload.text for r in g.kept]
        if k == 0:
            correct.append([r.payload.correct for r in g.kept])
        else:
            label = extract_final_answer(texts[0]) or texts[0]
            correct.append([reward(t, label, free).correct for t in texts])
    correct = torch.tensor(correct)
    rewards = torch.tensor([[r.reward for r in g.kept] for g in groups])
    lengths = torch.tensor([[float(r.length) for r in g.kept] for g in groups])
    classes, num_correct = classify_groups(rewards, lengths, AdoraConfig(rule="difficulty", tau=0.5), correct=correct)
    p = num_correct.double() / 4
    assert classes.tolist() == [TAS if 0 < x <= 0.5 else TDS for x in p.tolist()]
    assert p[0] == 0 and classes[0] == TDS and (p[1:] > 0).all()
    assert all(len(r.payload.response_ids) == r.length for g in groups for r in g.kept)


# ---------------------------------------------------------------------------------------------------------
# The trainer: a short geo-tiny run, resume, errors
# ---------------------------------------------------------------------------------------------------------

GEO_TINY = {
    "model.tiny.vocab_size": 300,
    "model.tiny.hidden_size": 32,
    "model.tiny.intermediate_size": 64,
    "model.tiny.num_hidden_layers": 2,
    "model.tiny.num_attention_heads": 2,
    "model.tiny.num_key_value_heads": 1,
    "model.tiny_vision.image_size": 32,
    "model.tiny_vision.depth": 1,
    "model.tiny_vision.hidden_size": 16,
    "model.tiny_vision.intermediate_size": 32,
    "data.num_train": 24,
    "data.num_eval": 4,
    "warmup.steps": 100,  # enough for well-formed answers, so groups have mixed rewards
    "warmup.lr": 1e-2,
    "warmup.batch_size": 8,
    "steps": 3,
    "prompts_per_step": 3,
    "sampling.n_keep": 4,
    "rollout.max_new_tokens": 24,
    "eval_every": 0,
    "save_every": 0,
    "eval_samples": 1,
    "train.lr": 1e-3,
}


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_geo_tiny_run_trains_saves_and_resumes(tmp_path):
    from adora_openrlhf.backends.local.trainer import train

    full = build_run_config("geo-tiny-adora", {**GEO_TINY, "save_every": 1, "output_dir": str(tmp_path / "full")})
    summary = train(full)
    records = _records(tmp_path / "full")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[0]["warmup/final_loss"] < records[0]["warmup/first_loss"]
    for r in records[1:]:
        assert np.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0
        # the difficulty rule has no neutral class
        assert r["adora/tas_fraction"] + r["adora/tds_fraction"] == pytest.approx(1.0)
    assert "eval/greedy_accuracy" in summary["eval_final"]
    final = tmp_path / "full" / "final_model"
    assert vlm.is_vlm_checkpoint(str(final)) and vlm.load_processor(str(final)).image_processor is not None

    # the held-out images are saved with the run, and a greedy `eval.run --run` repeats the trainer's held-out numbers
    from adora_openrlhf.evaluation.loop import SAMPLES_FILE, read_records
    from adora_openrlhf.evaluation.run import main

    held = [json.loads(line) for line in (tmp_path / "full" / "heldout.jsonl").read_text().splitlines()]
    assert all(
        ref.startswith("heldout_images/") and (tmp_path / "full" / ref).is_file()
        for row in held
        for ref in row["images"]
    )
    assert (
        main(
            [
                "--run",
                str(tmp_path / "full"),
                "--temperature",
                "0",
                "--k",
                "1",
                "--engine",
                "hf",
                "--out",
                str(tmp_path / "eval"),
            ]
        )
        == 0
    )
    samples = read_records(tmp_path / "eval" / SAMPLES_FILE)
    assert len(samples) == len(held)
    assert sum(r["correct"] for r in samples) / len(samples) == pytest.approx(
        summary["eval_final"]["eval/greedy_accuracy"]
    )
    assert sum(r["reward"] for r in samples) / len(samples) == pytest.approx(
        summary["eval_final"]["eval/greedy_reward"]
    )

    # resume: a copy of the run cut back to its step-2 checkpoint redoes step 3 exactly
    shutil.copytree(tmp_path / "full", tmp_path / "part")
    shutil.rmtree(tmp_path / "part" / "checkpoints" / "step_000003")
    saved = tmp_path / "part" / "config.json"
    saved.write_text(saved.read_text().replace(str(tmp_path / "full"), str(tmp_path / "part")))
    resumed = build_run_config("geo-tiny-adora", {**GEO_TINY, "save_every": 1, "output_dir": str(tmp_path / "part")})
    assert train(resumed, resume=True)["resumed_from_step"] == 2
    a, b = _records(tmp_path / "full"), _records(tmp_path / "part")
    assert b[-1]["train/loss"] == pytest.approx(a[-1]["train/loss"], rel=1e-4, abs=1e-6)
    assert b[-1]["sampling/first_round_mean_reward"] == pytest.approx(a[-1]["sampling/first_round_mean_reward"])


def test_geo_testbed_short_run_logs_reading_guessing_and_the_majority_baseline(tmp_path):
    """geo-testbed's settings at a tiny size: both warm-up phases with their styles, then RL with the difficulty rule;
    the probe's shares and the majority baseline reach the metrics."""
    from adora_openrlhf.backends.local.trainer import train

    small = {
        **GEO_TINY,
        "warmup.steps": 60,
        "warmup.mix_steps": 10,
        "eval_samples": 0,
        "output_dir": str(tmp_path / "run"),
    }
    cfg = build_run_config("geo-testbed-adora", small)
    assert cfg.data.geo.tasks == ["colour"] and cfg.data.geo.levels == [1, 2, 3]
    assert cfg.warmup.style_shares == {"read": 0.85, "default": 0.15} and cfg.warmup.mix == {
        "read": 0.5,
        "default": 0.5,
    }
    train(cfg)
    records = _records(tmp_path / "run")
    first = records[0]
    assert first["warmup/steps"] == 70 and 0.0 <= first["eval/majority_accuracy"] <= 1.0
    shares = [first[f"eval/greedy_{style}_fraction"] for style in ("read", "guess", "other")]
    assert sum(shares) == pytest.approx(1.0)
    for r in records[1:]:
        assert r["response/read_fraction"] + r["response/guess_fraction"] + r[
            "response/other_fraction"
        ] == pytest.approx(1.0)
        assert r["adora/tas_fraction"] + r["adora/tds_fraction"] == pytest.approx(1.0)
    levels = {
        json.loads(line)["meta"]["difficulty"] for line in (tmp_path / "run" / "heldout.jsonl").read_text().splitlines()
    }
    assert levels <= {1, 2, 3}


def test_geometry_with_a_text_checkpoint_is_refused(tmp_path):
    from adora_openrlhf.backends.local.trainer import train

    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    cfg = build_run_config("geo-tiny", {"model.path": str(tmp_path / "text"), "output_dir": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match="model.path: data.task 'geometry' needs a vision-language checkpoint"):
        train(cfg)
    with pytest.raises(ConfigError, match="model.tiny_vision.image_size: must be a positive multiple of"):
        build_run_config("geo-tiny", {"model.tiny_vision.image_size": 60})


# ---------------------------------------------------------------------------------------------------------
# Evaluation of a vision-language checkpoint: `python -m eval.run --engine hf`
# ---------------------------------------------------------------------------------------------------------


def test_eval_run_on_generated_images_and_mathvista_rows(tmp_path, capsys):
    """A warm-started tiny Qwen2.5-VL evaluated on the generated task and on MathVista-format rows (converted
    by data_prep.mathvista from records with images); each report equals a hand count on samples.jsonl."""
    from adora_openrlhf.backends.local.trainer import warm_start
    from adora_openrlhf.data_prep.mathvista import convert_mathvista_row
    from adora_openrlhf.evaluation.loop import SAMPLES_FILE, read_records
    from adora_openrlhf.evaluation.run import main

    cfg = build_run_config("geo-tiny", {**GEO_TINY, "warmup.steps": 3, "output_dir": str(tmp_path / "run")})
    model_dir = warm_start(cfg, tmp_path / "model")
    images = [r["images"][0] for r in geo_synth.generate_rows(2, 9)]
    raw = [
        {
            "pid": "1",
            "question": "How many shapes?",
            "query": "Hint: answer with an integer.\nQuestion: How many shapes?",
            "answer": "3",
            "question_type": "free_form",
            "answer_type": "integer",
            "decoded_image": images[0],
            "metadata": {"category": "math-targeted-vqa", "task": "counting"},
        },
        {
            "pid": "2",
            "question": "Which colour?",
            "answer": "red",
            "choices": ["red", "blue"],
            "question_type": "multi_choice",
            "answer_type": "text",
            "decoded_image": images[1],
            "metadata": {"category": "general-vqa", "task": "colour"},
        },
    ]
    mathvista = tmp_path / "mathvista.jsonl"
    mathvista.write_text(
        "".join(json.dumps(convert_mathvista_row(r, i + 1, tmp_path / "mv_images")) + "\n" for i, r in enumerate(raw))
    )
    for bench, extra in (("geo_synth", ["--limit", "3"]), ("mathvista", ["--bench-file", f"mathvista={mathvista}"])):
        out = tmp_path / f"eval_{bench}"
        argv = [
            "--model",
            str(model_dir),
            "--bench",
            bench,
            "--k",
            "2",
            "--out",
            str(out),
            "--max-new-tokens",
            "6",
            "--engine",
            "hf",
            "--temperature",
            "1.0",
            *extra,
        ]
        assert main(argv) == 0
        records = read_records(out / SAMPLES_FILE)
        assert len(records) == (6 if bench == "geo_synth" else 4) and all(
            isinstance(r["response"], str) for r in records
        )
        report = json.loads((out / "report.json").read_text())
        rows = {r["subset"]: r for r in report["rows"]}
        assert rows["all"]["avg_at_k"] == pytest.approx(sum(r["correct"] for r in records) / len(records))
        assert ({"ID", "OOD"} if bench == "mathvista" else {"task=count", "level=1"}) <= set(rows)
    # a row with two images for its one <image> slot: named by its file:line before any generation
    bad = [json.loads(line) for line in mathvista.read_text().splitlines()]
    bad[1]["images"] = bad[1]["images"] * 2
    mathvista.write_text("".join(json.dumps(row) + "\n" for row in bad))
    out = tmp_path / "eval_bad"
    argv = ["--model", str(model_dir), "--bench", "mathvista", "--k", "1", "--temperature", "0", "--out", str(out)]
    capsys.readouterr()
    assert main([*argv, "--engine", "hf", "--bench-file", f"mathvista={mathvista}"]) == 2
    assert f"{mathvista}:2: field 'images': 2 image(s) for 1 image slot(s)" in capsys.readouterr().err
    assert not (out / SAMPLES_FILE).exists()
