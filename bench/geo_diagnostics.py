"""What a ``geo-tiny`` run's checkpoints do on the held-out images: the policy's answers, its ``<think>`` and the images.

``python -m bench.geo_diagnostics --run runs/geo-tiny [--steps 0 20 40] [--samples 4] [--out DIR]``

For each checkpoint (``--run``'s ``checkpoints/step_*``, all by default) on the run's saved held-out set
(``heldout.jsonl`` and its images), three views: ``greedy`` (one greedy response per image), ``sampled``
(``--samples`` responses per image at temperature 1, the distribution RL trains) and ``blank`` (greedy, every
image replaced by a white one of the same size: what the policy answers without looking). Per view:

- accuracy, overall and per question kind (``colour``, ``larger``);
- ``top answer share``: the share of colour questions answered with the view's most frequent answer (1/4 when
  the four colours are answered equally often, as they are the labels; 1 when every answer is the same colour);
- for ``colour`` questions, whether the ``<think>`` reads the image and whether the answer follows it:
  ``think names the shape`` (the think gives a colour to a shape of the asked kind), ``think right`` (that colour
  is the label), ``answer follows think`` (the answer is that colour, among responses whose think names the
  shape), and the answer's accuracy when the think is right and when it is wrong (:func:`think_answer_counts`);
- for ``larger`` questions, the share of answers that are not among the question's choices.

Prints a table and writes ``table.md`` and ``results.json`` to ``--out`` (default ``RUN/diagnostics``).
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adora_openrlhf.tasks.geo_synth import COLOURS
from bench.common import markdown_table, write_json

VIEWS = ("greedy", "sampled", "blank")


def answer_of(text: str) -> str | None:
    """The text of the last ``<answer>...</answer>`` block, stripped, as the reward reads it; None without one."""
    found = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    return found[-1].strip() if found else None


def think_colour(text: str, kind: str) -> str | None:
    """The colour the ``<think>`` block gives to the first shape of ``kind`` (``"... blue circle ..."`` -> blue),
    or None when the think names no shape of that kind with a colour (or there is no think block)."""
    found = re.search(r"<think>(.*?)</think>", text, re.S)
    if not found:
        return None
    words = re.findall(r"[a-z]+", found.group(1).lower())
    for before, word in zip(words, words[1:], strict=False):
        if word == kind and before in COLOURS:
            return before
    return None


def asked_kind(prompt: str) -> str:
    """The shape kind a colour question asks about: ``What colour is the circle?`` -> circle."""
    found = re.search(r"What colour is the (\w+)\?", prompt)
    if not found:
        raise ValueError(f"not a colour question: {prompt!r}")
    return found.group(1)


def think_answer_counts(rows: Sequence[Mapping[str, Any]], texts: Sequence[Sequence[str]]) -> dict[str, float]:
    """For the colour questions of ``rows`` (``texts[i]``: the responses to row i): the shares named in the
    module docstring. ``think names the shape`` and ``think right`` over all responses; ``answer follows think``
    over responses whose think names the shape; ``answer right if think right`` and ``if think wrong`` over the
    responses whose think gives the shape the right or a wrong colour (0 when there are none)."""
    count: collections.Counter[str] = collections.Counter()
    for row, responses in zip(rows, texts, strict=True):
        if row["meta"]["task"] != "colour":
            continue
        kind, label = asked_kind(row["prompt"]), str(row["label"])
        for text in responses:
            thought, answer = think_colour(text, kind), answer_of(text)
            count["n"] += 1
            if thought is None:
                continue
            count["named"] += 1
            count["follows"] += answer == thought
            key = "think_right" if thought == label else "think_wrong"
            count[key] += 1
            count[key + "_answer_right"] += answer == label
    share = lambda a, b: count[a] / count[b] if count[b] else 0.0  # noqa: E731
    return {
        "think names the shape": share("named", "n"),
        "think right": share("think_right", "n"),
        "answer follows think": share("follows", "named"),
        "answer right if think right": share("think_right_answer_right", "think_right"),
        "answer right if think wrong": share("think_wrong_answer_right", "think_wrong"),
    }


def view_metrics(
    rows: Sequence[Mapping[str, Any]], texts: Sequence[Sequence[str]], correct: Sequence[Sequence[bool]]
) -> dict[str, float]:
    """Accuracy (overall, per kind), the top answer share of colour questions, the think/answer shares and the
    share of larger-question answers outside the choices, for one view's responses."""
    by_kind: dict[str, list[bool]] = collections.defaultdict(list)
    colour_answers: collections.Counter[str | None] = collections.Counter()
    outside = larger = 0
    for row, responses, marks in zip(rows, texts, correct, strict=True):
        kind = row["meta"]["task"]
        by_kind[kind] += list(marks)
        for text in responses:
            answer = answer_of(text)
            if kind == "colour":
                colour_answers[answer] += 1
            elif kind == "larger":
                larger += 1
                outside += answer not in row["meta"].get("choices", [])
    every = [m for marks in by_kind.values() for m in marks]
    metrics = {"accuracy": sum(every) / len(every)}
    metrics.update({f"accuracy {kind}": sum(v) / len(v) for kind, v in sorted(by_kind.items())})
    if colour_answers:
        metrics["top answer share"] = colour_answers.most_common(1)[0][1] / sum(colour_answers.values())
        metrics.update(think_answer_counts(rows, texts))
    if larger:
        metrics["larger: answer not a choice"] = outside / larger
    return metrics


def held_out(rows_file: Path, cache_dir: Path) -> list[dict[str, Any]]:
    """The run's held-out rows, read and their images resolved and checked as ``eval.run --run`` reads them."""
    from adora_openrlhf.evaluation.benchmarks import HELDOUT, get_benchmark, load_located_rows

    return [
        dict(row)
        for _, row in load_located_rows(get_benchmark(HELDOUT), str(rows_file), None, 0, None, cache_dir=cache_dir)
    ]


def with_images(rows: Sequence[dict[str, Any]], image: Path) -> list[dict[str, Any]]:
    """``rows`` with every image replaced by ``image``."""
    return [{**row, "images": [str(image)] * len(row.get("images") or [])} for row in rows]


def blank_image(like: str, out: Path) -> Path:
    """A white image of ``like``'s size, saved under ``out``."""
    from PIL import Image

    with Image.open(like) as image:
        size = image.size
    path = out / f"blank_{size[0]}x{size[1]}.png"
    out.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (255, 255, 255)).save(path)
    return path


def diagnose(
    model: str, rows: Sequence[dict[str, Any]], blank_rows: Sequence[dict[str, Any]], samples: int, max_new_tokens: int
) -> dict[str, dict[str, float]]:
    """The three views' metrics for one checkpoint (each image its own seed, so the views are reproducible); the
    model is loaded once and each view sets its own decoding."""
    from adora_openrlhf.evaluation.generation import EvalSampling, HFGenerator
    from adora_openrlhf.evaluation.loop import grade

    generator = HFGenerator(model, EvalSampling(), batch_size=64)
    results = {}
    for view, view_rows, temperature, k in (
        ("greedy", rows, 0.0, 1),
        ("sampled", rows, 1.0, samples),
        ("blank", blank_rows, 0.0, 1),
    ):
        generator.sampling = EvalSampling(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, seed=0)
        outputs = generator.generate(view_rows, k, seeds=list(range(len(view_rows))))
        texts = [[c.text for c in completions] for completions in outputs]
        correct = [
            [bool(grade(row["source"], text, row)["correct"]) for text in responses]
            for row, responses in zip(view_rows, texts, strict=True)
        ]
        results[view] = view_metrics(view_rows, texts, correct)
    return results


def table(records: Sequence[Mapping[str, Any]]) -> str:
    """One row per (checkpoint step, view), one column per metric."""
    names = list(dict.fromkeys(name for r in records for view in VIEWS for name in r[view]))
    rows = [
        [str(r["step"]), view, *(f"{r[view][n]:.3f}" if n in r[view] else "-" for n in names)]
        for r in records
        for view in VIEWS
    ]
    return markdown_table(["step", "view", *names], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.geo_diagnostics", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", type=Path, required=True, help="a geo-tiny run directory (heldout.jsonl, checkpoints/step_*)"
    )
    parser.add_argument("--steps", type=int, nargs="*", help="checkpoint steps (default: every checkpoint of the run)")
    parser.add_argument("--samples", type=int, default=4, help="responses per image in the sampled view")
    parser.add_argument("--out", type=Path, help="where table.md and results.json go (default RUN/diagnostics)")
    args = parser.parse_args(argv)
    import torch

    from adora_openrlhf.evaluation.runs import open_run

    torch.set_num_threads(1)
    try:
        target = open_run(args.run)
    except ValueError as err:  # names --run and the fix
        parser.error(str(err))
    found = {
        int(p.name.split("_")[-1]): p
        for p in sorted((args.run / "checkpoints").glob("step_*"))
        if (p / "config.json").exists()
    }
    steps = args.steps if args.steps else sorted(found)
    missing = [s for s in steps if s not in found]
    if missing or not steps:
        parser.error(
            f"--steps: no checkpoint for {missing or 'any step'} in {args.run / 'checkpoints'} (found {sorted(found)})"
        )
    out = args.out or args.run / "diagnostics"
    rows = held_out(target.rows_file, out)
    blank_rows = with_images(rows, blank_image(rows[0]["images"][0], out))
    records = []
    for step in steps:
        records.append(
            {"step": step, **diagnose(str(found[step]), rows, blank_rows, args.samples, target.max_new_tokens)}
        )
        print(f"[geo_diagnostics] step {step} done", flush=True)
    text = table(records)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"run": str(args.run), "samples": args.samples, "records": records})
    (out / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
