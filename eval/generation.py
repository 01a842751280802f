"""Response generators for evaluation: vLLM on GPU machines, `transformers` everywhere else.

A generator maps a batch of rows (the JSONL schema, images included) to ``k`` sampled responses each. ``pick_generator``
uses vLLM when it is importable and a CUDA device is present, else `transformers`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch


@dataclass(frozen=True)
class EvalSampling:
    """Decoding for evaluation (the ADORA and Logic-RL reports sample at temperature 0.6-1.0)."""

    temperature: float = 0.6  # 0 = greedy (then k should be 1)
    top_p: float = 0.95
    max_new_tokens: int = 1024
    seed: int = 0


class Generator(Protocol):
    def generate(self, rows: Sequence[Mapping[str, Any]], k: int) -> list[list[str]]:
        """k responses for each row."""


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

    def __init__(self, model_path: str, sampling: EvalSampling, batch_size: int = 8):
        from adora_openrlhf.backends.local import vlm
        from adora_openrlhf.backends.local.model import load_pretrained, pick_device
        from adora_openrlhf.backends.local.tokenization import load_tokenizer

        device = pick_device()
        dtype = "bfloat16" if device.type == "cuda" else "float32"
        self.processor = vlm.load_processor(model_path) if vlm.is_vlm_checkpoint(model_path) else None
        self.tokenizer = self.processor.tokenizer if self.processor is not None else load_tokenizer(model_path)
        self.model = (vlm.load_vlm if self.processor is not None else load_pretrained)(model_path, dtype).to(device).eval()
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

    def generate(self, rows: Sequence[Mapping[str, Any]], k: int) -> list[list[str]]:
        from adora_openrlhf.backends.local.rollout import generate_responses
        from adora_openrlhf.config import SamplingParams

        greedy = self.sampling.temperature == 0
        params = SamplingParams(
            temperature=1.0 if greedy else self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_new_tokens=self.sampling.max_new_tokens,
        )
        prompts, extras = self._encode(rows)
        more = {"extras": [e for e in extras for _ in range(k)]} if extras is not None else {}
        torch.manual_seed(self.sampling.seed)
        responses = generate_responses(self.model, self.tokenizer, [p for p in prompts for _ in range(k)], params, self.batch_size, greedy=greedy, **more)
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids, _ in responses]
        return [texts[i * k : (i + 1) * k] for i in range(len(rows))]


class VLLMGenerator:  # pragma: no cover - needs a GPU and vllm
    """vLLM offline engine; images (VLM benchmarks) go in as multi-modal data."""

    def __init__(self, model_path: str, sampling: EvalSampling, tensor_parallel_size: int = 1):
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel_size, seed=sampling.seed, trust_remote_code=True)
        self.tokenizer = self.llm.get_tokenizer()
        self.make_params = lambda k: SamplingParams(
            n=k, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens, seed=sampling.seed
        )

    def generate(self, rows: Sequence[Mapping[str, Any]], k: int) -> list[list[str]]:
        from PIL import Image

        requests = []
        for row in rows:
            request: dict[str, Any] = {"prompt": render_prompt(self.tokenizer, row["prompt"])}
            if row.get("images"):
                images = [Image.open(path).convert("RGB") for path in row["images"]]
                request["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
            requests.append(request)
        outputs = self.llm.generate(requests, self.make_params(k))
        return [[choice.text for choice in out.outputs] for out in outputs]


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
