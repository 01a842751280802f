"""The run's configuration: :class:`RunConfig` assembled from one typed config per component.

The algorithms' sections live beside their algorithms (``AdoraConfig`` in ``algorithms/adora.py``,
``SamplingParams`` and ``AdaptiveSamplingConfig`` in ``algorithms/sampling.py``, ``AdvantageConfig``,
``DynamicFilteringConfig``, ``PolicyLossConfig``) and the model's beside the engine (``ModelConfig``,
``TinyModelConfig`` and ``TinyVisionConfig`` in ``engine/model_config.py``); they are re-exported here. This module
defines the data, warm-up and run sections and the checks that span sections. The validation helpers are in ``config_checks.py``.

Each dataclass documents its fields where they are defined: ``option(default, "help")`` (``config_checks.option``,
a field with ``metadata={"help": ...}``) is the reference,
and the text of every dotted flag's ``--help`` (``cli_args.py``). Every
config validates itself in ``__post_init__`` and raises :class:`ConfigError` naming the field and the fix,
so a bad recipe or flag fails before any model is built.

Configs are plain dataclasses: ``dataclasses.asdict`` gives the JSON saved with each run, and
``from_dict`` rebuilds them (unknown keys are an error, not silently ignored).

Every ``__post_init__`` starts with :func:`check_field_types`: each field's value has its annotated type,
whatever it came from (a flag, a ``--config`` file, a recipe, ``bench --set``, Python code). A boolean is
``true`` or ``false`` and nothing else (not ``"false"``, which is truthy, nor ``null``, ``0`` or ``2``); a string
field holds a string; a list, a mapping and a nested section hold one. Numbers are checked, with their range, by
the section's own :func:`check_number` calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from adora_openrlhf.algorithms.adora import AdoraConfig
from adora_openrlhf.algorithms.advantages import AdvantageConfig
from adora_openrlhf.algorithms.allocation import AllocationConfig
from adora_openrlhf.algorithms.critic import CriticConfig
from adora_openrlhf.algorithms.dynamic_filtering import DynamicFilteringConfig
from adora_openrlhf.algorithms.policy_loss import PolicyLossConfig
from adora_openrlhf.algorithms.sampling import AdaptiveSamplingConfig, SamplingParams
from adora_openrlhf.algorithms.token_advantages import token_estimator_problem
from adora_openrlhf.config_checks import (
    check_choice,
    check_field_types,
    check_number,
    clear_type_hints,
    from_dict,
    option,
    require,
)
from adora_openrlhf.engine.model_config import DECODINGS as DECODINGS  # re-exported: the model section
from adora_openrlhf.engine.model_config import KV_CACHES as KV_CACHES
from adora_openrlhf.engine.model_config import NUMERICS as NUMERICS
from adora_openrlhf.engine.model_config import ModelConfig
from adora_openrlhf.engine.model_config import TinyModelConfig as TinyModelConfig
from adora_openrlhf.engine.model_config import TinyVisionConfig as TinyVisionConfig
from adora_openrlhf.errors import ConfigError  # defined beside the registries (no import circle); exported here
from adora_openrlhf.plugins import import_plugins
from adora_openrlhf.prompt_templates import PROMPT_TEMPLATES
from adora_openrlhf.rewards.grading import GradingConfig
from adora_openrlhf.tasks.registry import OPTIONS_LISTENERS, TASKS, is_vision_task

# ---------------------------------------------------------------------------------------------------------
# Data, optimisation, and the whole run
# ---------------------------------------------------------------------------------------------------------

BACKENDS = ("local", "openrlhf")


@dataclass
class DataFields:
    """Training / evaluation prompts in the one JSONL schema (prompt, label, images, source, meta): the fields of
    every task. :data:`DataConfig` adds each registered task's own options section (``data.kk``, ``data.geo``, a
    plug-in task's), from ``Task.options``."""

    task: str = option(
        "kk",
        '"kk" | "math" | "geometry" or a plugin\'s task (tasks/registry.py): its rows\' default source, generator and checks',
    )
    train_path: str | None = option(None, "JSONL file or HF dataset name; None -> generated K&K puzzles (task kk)")
    eval_path: str | None = option(None, "held-out JSONL; None -> generated K&K puzzles disjoint from training")
    num_train: int = option(2000, "generated training puzzles")
    num_eval: int = option(100, "generated held-out puzzles")
    rl_prompts: int | None = option(
        None,
        "RL steps draw their prompts from the first k training rows only (the warm-up uses every row), so each "
        "is seen several times; None = every training row",
    )
    max_prompt_tokens: int = option(512, "prompts longer than this are rejected with their row index")
    prompt_template: str = option(
        "auto", 'local backend: "auto" (chat template if the tokenizer has one, else "compact") | "chat" | "compact"'
    )

    def __post_init__(self) -> None:
        check_field_types(self, "data")
        PROMPT_TEMPLATES.check(self.prompt_template)
        TASKS.check(self.task)
        check_number(self.num_train, "data.num_train", integer=True, ge=1)
        check_number(self.num_eval, "data.num_eval", integer=True, ge=1)
        check_number(self.rl_prompts, "data.rl_prompts", integer=True, ge=1, also=(None,))
        check_number(self.max_prompt_tokens, "data.max_prompt_tokens", integer=True, ge=1)
        for name in ("train_path", "eval_path"):
            value = getattr(self, name)
            require(
                value is None or (isinstance(value, str) and value.strip() != ""),
                f"data.{name}",
                f"must be a file path or dataset name, got {value!r}",
            )


def _task_sections() -> list[tuple[str, Any, Any]]:
    """``(section, options class, field)`` of every registered task with options, in registration order."""
    sections = []
    taken = {f.name for f in dataclasses.fields(DataFields)}  # and, as the loop goes, the sections made so far
    for name, task in TASKS.items():
        if task.options is None:
            continue
        key = task.section
        require(
            key not in taken,
            f"data.{key}",
            f"task {name!r}: its options section {key!r} is taken (by a field of data or another task); set options_key",
        )
        doc = (task.options.__doc__ or "").strip().splitlines()
        help_text = f"task {name}: {doc[0] if doc else 'its options'} ({task.options.__module__})"
        sections.append((key, task.options, option(factory=task.options, help=help_text)))
        taken.add(key)
    return sections


def _build_data_config() -> type:
    """``DataConfig``: :class:`DataFields` plus one section per task with options (a dataclass made here)."""
    cls = dataclasses.make_dataclass("DataConfig", _task_sections(), bases=(DataFields,))
    cls.__module__ = __name__
    cls.__doc__ = DataFields.__doc__
    return cls


DataConfig: Any = _build_data_config()  # rebuilt when a plug-in registers a task with options
# called after each rebuild (cli_args refreshes its table of flags)
DATA_CONFIG_LISTENERS: list[Callable[[], None]] = []


def _task_with_options_registered(task: Any) -> None:
    global DataConfig
    DataConfig = _build_data_config()
    clear_type_hints()  # RunConfig's ``data`` field now means the new class
    for listener in list(DATA_CONFIG_LISTENERS):
        listener()


OPTIONS_LISTENERS.append(_task_with_options_registered)


@dataclass
class WarmupConfig:
    """Supervised warm-up before RL (local backend): next-token loss on the task's demonstrations, so a
    random-init model has some reward signal. Two phases: ``steps`` on demonstrations of one ``style`` (or of a
    mixture, ``style_shares``), then ``mix_steps`` on a mixture of styles (``mix``). Styles are registered per
    task in ``backends/local/sft.py`` (K&K: ``direct``, ``thorough``, ``shortcut``, ``restate``). Each phase's learning rate
    rises linearly from 0 over the first ``lr_ramp`` fraction of its steps, then decays linearly to 0."""

    steps: int = option(0, "phase 1: optimiser steps of supervised training before RL; 0 = none")
    lr: float = option(1e-3, "phase 1 AdamW learning rate (linear decay to 0)")
    batch_size: int = option(32, "demonstrations per warm-up step (both phases)")
    style: str = option("direct", "phase 1 demonstration style (K&K: direct | thorough | shortcut | restate)")
    style_shares: dict[str, float] = option(
        factory=dict,
        help='phase 1 as a mixture of styles instead of warmup.style alone, e.g. {"thorough": 0.85, "shortcut": 0.15}; {} = warmup.style only',
    )
    lr_ramp: float = option(0.0, "fraction of each phase's steps over which the lr rises linearly from 0 (0 = none)")
    mix_steps: int = option(0, "phase 2: optimiser steps on a mixture of styles; 0 = no phase 2")
    mix_lr: float = option(1e-3, "phase 2 AdamW learning rate (linear decay to 0)")
    mix: dict[str, float] = option(factory=dict, help='phase 2 style shares, e.g. {"thorough": 0.3, "shortcut": 0.7}')

    def __post_init__(self) -> None:
        check_field_types(self, "warmup")
        check_number(self.steps, "warmup.steps", integer=True, ge=0)
        check_number(self.lr, "warmup.lr", gt=0)
        check_number(self.batch_size, "warmup.batch_size", integer=True, ge=1)
        require(
            isinstance(self.style, str) and bool(self.style),
            "warmup.style",
            f"must be a style name, got {self.style!r}",
        )
        require(
            isinstance(self.style_shares, Mapping),
            "warmup.style_shares",
            'must be a mapping style -> share, e.g. {"thorough": 0.85, "shortcut": 0.15}',
        )
        for style, share in self.style_shares.items():
            check_number(share, f"warmup.style_shares[{style!r}]", ge=0)
        require(
            not self.style_shares or sum(self.style_shares.values()) > 0,
            "warmup.style_shares",
            "give at least one style a positive share, or {} for warmup.style alone",
        )
        check_number(self.lr_ramp, "warmup.lr_ramp", ge=0, lt=1)
        check_number(self.mix_steps, "warmup.mix_steps", integer=True, ge=0)
        check_number(self.mix_lr, "warmup.mix_lr", gt=0)
        require(
            isinstance(self.mix, Mapping),
            "warmup.mix",
            'must be a mapping style -> share, e.g. {"thorough": 0.3, "shortcut": 0.7}',
        )
        for style, share in self.mix.items():
            check_number(share, f"warmup.mix[{style!r}]", ge=0)
        require(
            self.mix_steps == 0 or sum(self.mix.values()) > 0,
            "warmup.mix",
            "give at least one style a positive share when warmup.mix_steps > 0",
        )


REPORT_TO_CHOICES = ("tensorboard", "wandb", "none")  # rundir/metrics.py TRACKERS, plus "none"


def parse_report_to(value: Any) -> list[str]:
    """``report_to`` as a list of tracker names (``"tensorboard,wandb"`` -> ``["tensorboard", "wandb"]``), checked:
    known names, ``none`` alone, and an importable ``wandb`` when wandb is asked for."""
    names = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    require(
        isinstance(names, list) and all(isinstance(n, str) for n in names),
        "report_to",
        f"must be a list or comma list of {list(REPORT_TO_CHOICES)}, got {value!r}",
    )
    unknown = [n for n in names if n not in REPORT_TO_CHOICES]
    require(not unknown, "report_to", f"unknown tracker(s) {unknown}; choose from {list(REPORT_TO_CHOICES)}")
    require(
        "none" not in names or len(names) == 1,
        "report_to",
        f"'none' cannot be combined with other trackers, got {names}",
    )
    if "wandb" in names:
        import importlib.util

        require(
            importlib.util.find_spec("wandb") is not None,
            "report_to",
            "'wandb' needs the wandb package, which is not installed; install it with "
            "`pip install 'adora_openrlhf[wandb]'` (or `pip install wandb`), or drop wandb from report_to",
        )
    return list(names)


@dataclass
class RunConfig:
    """One training run: recipe name, backend and every component's config."""

    recipe: str = option("kk-tiny", "named preset this config was built from (adora_openrlhf.recipes.RECIPES)")
    backend: str = option("local", '"local" (embedded, one process) | "openrlhf" (Ray + vLLM + DeepSpeed cluster)')
    seed: int = option(0, "seed of data order, model init, sampling and evaluation; in [0, 2**32)")
    steps: int = option(100, "RL steps (each: sample, score, advantages, policy update)")
    prompts_per_step: int = option(8, "prompts per RL step (rollout batch)")
    output_dir: str = option("runs/kk-tiny", "run directory: config, metrics, checkpoints, final model")
    save_every: int = option(25, "checkpoint every k steps (0 = only at the end)")
    eval_every: int = option(25, "held-out evaluation every k steps (0 = only at start and end)")
    report_to: list[str] = option(
        factory=lambda: ["tensorboard"],
        help="local backend: experiment trackers besides metrics.jsonl (always written), a list or a comma "
        "list of " + ", ".join(REPORT_TO_CHOICES) + "; 'none' = JSONL only. wandb needs `pip install "
        "'adora_openrlhf[wandb]'`; WANDB_MODE=offline runs it with no network",
    )
    rollout: SamplingParams = option(factory=SamplingParams, help="default (round-0) sampling parameters")
    advantage: AdvantageConfig = option(
        factory=AdvantageConfig, help="advantage estimator: a group baseline, gae or reinforce"
    )
    critic: CriticConfig = option(
        factory=CriticConfig, help="the value model of advantage.estimator gae (local backend)"
    )
    adora: AdoraConfig = option(factory=AdoraConfig, help="ADORA advantage reweighting")
    sampling: AdaptiveSamplingConfig = option(factory=AdaptiveSamplingConfig, help="n_keep = group size n")
    allocation: AllocationConfig = option(
        factory=AllocationConfig, help="rollout allocation: which prompts a step samples and how many responses each"
    )
    dynamic_filtering: DynamicFilteringConfig = option(
        factory=DynamicFilteringConfig, help="DAPO dynamic filtering: drop all-correct/all-wrong groups and refill"
    )
    grading: GradingConfig = option(
        factory=GradingConfig, help="grading a step's responses: workers and the step's deadline"
    )
    model: ModelConfig = option(factory=ModelConfig, help="policy model")
    data: DataConfig = option(factory=lambda: DataConfig(), help="training and held-out prompts")
    train: PolicyLossConfig = option(factory=PolicyLossConfig, help="policy loss and optimiser")
    warmup: WarmupConfig = option(factory=WarmupConfig, help="local backend: supervised warm-up before RL")
    eval_samples: int = option(
        1,
        "held-out evaluation: sampled responses per puzzle (rollout parameters) besides the greedy one; 0 = greedy only",
    )
    extra: dict[str, Any] = option(factory=dict, help="backend-specific options (e.g. OpenRLHF pass-through flags)")
    plugins: list[str] = option(
        factory=list,
        help="modules to import before the run, on every process (both backends, every Ray worker): a user's own "
        "estimators, ADORA rules, exit rules, rewards and templates, registered by their decorators (plugins.py); "
        "a list or a comma list",
    )
    max_missing_reward_fraction: float = option(
        0.01,
        "openrlhf backend: rollouts of a batch that OpenRLHF's executor returns without a reward are "
        "scored 0 and counted (info 'reward_missing'); the run fails when their fraction exceeds this",
    )

    def __post_init__(self) -> None:
        self.report_to = parse_report_to(self.report_to)  # a comma list of names becomes a list first
        check_field_types(self, "")
        check_choice(self.backend, BACKENDS, "backend", "backend")
        check_number(self.seed, "seed", integer=True, ge=0, lt=2**32)  # NumPy's seed range
        check_number(self.steps, "steps", integer=True, ge=1)
        check_number(self.prompts_per_step, "prompts_per_step", integer=True, ge=1)
        check_number(self.save_every, "save_every", integer=True, ge=0)
        check_number(self.eval_every, "eval_every", integer=True, ge=0)
        check_number(self.eval_samples, "eval_samples", integer=True, ge=0)
        check_number(self.max_missing_reward_fraction, "max_missing_reward_fraction", ge=0, le=1)
        require(
            isinstance(self.output_dir, str) and self.output_dir.strip() != "",
            "output_dir",
            f"must be a directory path, got {self.output_dir!r}",
        )
        require(
            not self.model.freeze_visual_encoder or is_vision_task(self.data.task),
            "model.freeze_visual_encoder",
            f"applies to vision-language models (an image task such as geometry), got data.task {self.data.task!r}; drop --model.freeze_visual_encoder",
        )
        if self.dynamic_filtering.enabled:
            require(
                not self.sampling.enabled,
                "dynamic_filtering.enabled",
                "DAPO dynamic filtering and adaptive sampling (sampling.enabled) are alternatives; use one: "
                "--dynamic_filtering.enabled false or --sampling.enabled false",
            )
            require(
                self.sampling.n_keep >= 2,
                "dynamic_filtering.enabled",
                f"needs groups of 2 or more responses (sampling.n_keep = {self.sampling.n_keep}): a single response's mean "
                "correctness is 0 or 1, outside the kept range; raise --sampling.n_keep",
            )

        self._check_group_size()

    def _check_group_size(self) -> None:
        """What groups of ``sampling.n_keep`` responses allow: the token estimators' refusals
        (``algorithms/token_advantages.token_estimator_problem``), and a group estimator or allocation that needs n >= 2."""
        problem = token_estimator_problem(
            self.advantage.estimator,
            self.sampling.n_keep,
            self.adora.enabled,
            self.sampling.enabled,
            self.adora.length_shaping,
        )
        if problem is not None:
            raise ConfigError.about(*problem)
        require(
            self.sampling.n_keep >= 2
            or self.sampling.enabled
            or self.allocation.method == "knapsack"
            or self.advantage.token_level,  # the critic or the batch is the baseline
            "sampling.n_keep",
            f"groups of one response (n_keep = 1) get advantage 0 under every group-relative estimator (advantage.estimator "
            f"{self.advantage.estimator!r}), so the run would train nothing; use --sampling.n_keep 2 or more, or adaptive "
            "sampling (--sampling.enabled true), whose baseline comes from the whole pool",
        )
        pool = self.sampling.response_budget
        require(  # n_keep = 1 with the sampler: the baseline is the pool's, which needs two responses
            self.sampling.n_keep >= 2
            or not self.sampling.enabled
            or pool >= 2
            or self.sampling.pool_scope == "history",
            "sampling.max_rounds",
            f"with sampling.n_keep = 1 the baseline comes from the prompt's pool, which holds at most {pool} response "
            "(sampling.samples_per_round x max_rounds, capped by max_responses_per_prompt), so every advantage would be 0 "
            "and the run would train nothing; raise --sampling.samples_per_round or --sampling.max_rounds, or --sampling.n_keep",
        )
        if self.allocation.method in ("skip", "difficulty"):
            require(
                self.sampling.n_keep >= 2,
                "allocation.method",
                f"{self.allocation.method!r} predicts the signal of groups of sampling.n_keep responses, which needs n_keep >= 2 "
                f"(got {self.sampling.n_keep}); raise --sampling.n_keep",
            )

    @property
    def n_samples_per_prompt(self) -> int:
        """The training group size n (kept responses per prompt)."""
        return self.sampling.n_keep

    @property
    def positive_threshold(self) -> float:
        """The sampler's positive label: reward > this; ``sampling.positive_threshold``, or when unset (None)
        ``adora.correct_threshold``, so that ADORA's correct and the exit rule's positive agree by default."""
        own = self.sampling.positive_threshold
        return self.adora.correct_threshold if own is None else own

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(values: Mapping[str, Any]) -> RunConfig:
        """The config of ``values`` (nested mappings, unknown keys an error); the ``plugins`` it names are imported
        first, so that the names they register are valid choices of the other fields."""
        import_plugins(values.get("plugins", []))
        return from_dict(RunConfig, values)
