"""Rollout allocation: which prompts a step samples, and how many responses each gets.

A group carries a learning signal only when its responses differ in reward (group-relative advantages are zero
otherwise). A prompt the policy always solves, or never solves, costs tokens and teaches nothing. The allocators
here use each prompt's history to spend a step's responses where a signal is likely.

**Statistics store** (:class:`PromptStatsStore`). Per prompt key a Beta posterior over its pass rate p (the
chance that one response is positive): prior Beta(a0, b0); observing s positives among m responses gives
a <- a0 + gamma (a - a0) + s and b <- b0 + gamma (b - b0) + (m - s), so evidence from k observations ago
weighs gamma^k (``decay``; 1 keeps everything). Bounded: past ``max_prompts`` keys, the least recently observed
is forgotten.

**Predictions** under Beta(a, b), with E[p^k] = prod_{j<k} (a + j) / (a + b + j) (:func:`beta_moment`):
- zero-variance probability of a group of k: z(k) = E[p^k] + E[(1 - p)^k] (all positive or all negative);
- signal probability s(k) = 1 - z(k) (:func:`signal_probability`), 0 for k <= 1. Within one group each response
  is a draw with the same p, so these are exact for the posterior predictive.

**Exploration**: each candidate is, with probability ``explore``, scored with the prior instead of its posterior
(as if unseen), so a prompt predicted useless is checked again now and then and a stale prediction is corrected.

**Allocators** (registry :data:`ALLOCATORS`; each a pure function of the candidates' posteriors): given C
candidate prompts (the next C of the data order), P = ``prompts_per_step`` and n = the group size, return a
count k_c >= 0 per candidate (0 = not sampled):
- ``uniform``: k = n for the first P candidates (plain GRPO);
- ``skip`` (GRESO-style pre-rollout skipping): walk the candidates in order; skip candidate c when
  z_c(n) >= ``skip_threshold`` (unless explored); give n to each kept one until P are kept. With C = P
  (``candidates`` 1) a skipped prompt is simply not sampled this step: the step generates fewer responses;
- ``difficulty`` (online difficulty filtering, DOTS-style): the P candidates with the highest s_c(n), n each;
- ``knapsack`` (budgeted allocation): maximise sum_c v_c(k_c) subject to sum_c k_c <= B, k_c = 0 or
  ``min_responses`` <= k_c <= ``max_responses``, at most P prompts sampled, B = round(``budget`` * P * n). The value
  v of a group of k is chosen by ``value`` (registry :data:`KNAPSACK_VALUES`):
  - ``signal``: v(k) = s(k), the expected number of groups with signal;
  - ``information`` (Knapsack RL's task value): v(k) = E[s(k; p) p (1 - p)^2], the chance of a non-zero gradient
    times an information gain p (1 - p)^2 that peaks at p = 1/3 and favours the prompts still being learned over
    the nearly solved ones; under Beta(a, b), with M(m, n) = E[p^m (1 - p)^n] (:func:`beta_mixed_moment`),
    v(k) = M(1, 2) - M(k + 1, 2) - M(1, k + 2).
  Both are concave in k for k >= 1 (the increments of s(k; p) are p^k (1 - p) + (1 - p)^k p, which shrink for every
  p, and a non-negative weight keeps that), so greedy allocation by gain per response is exact for the increments;
  a prompt's first item is ``min_responses`` at once (a group of one has no signal).
Ties are broken by the candidates' order. An allocation that samples no candidate gives n responses to the one
with the highest s(n), so that every step trains on something.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adora_openrlhf.config_checks import check_field_types, check_number, option, require
from adora_openrlhf.registry import Registry

if TYPE_CHECKING:
    from adora_openrlhf.algorithms.sampling import SamplingResult


@dataclass
class AllocationConfig:
    """Rollout allocation (``algorithms/allocation.py``): which prompts each step samples and how many responses each.

    ``method`` ``uniform`` is plain GRPO (the next ``prompts_per_step`` prompts, ``sampling.n_keep`` responses each)."""

    method: str = option(
        "uniform", 'one of algorithms.allocation.ALLOCATORS: "uniform", "skip", "difficulty", "knapsack"'
    )
    candidates: float = option(
        1.0,
        "prompts examined per step = round(candidates * prompts_per_step) of the data order (>= 1; difficulty needs > 1)",
    )
    budget: float = option(1.0, "knapsack: responses per step = round(budget * prompts_per_step * n_keep)")
    min_responses: int = option(
        2, "knapsack: fewest responses a sampled prompt gets (>= 2: a group of one has no signal)"
    )
    max_responses: int = option(16, "knapsack: most responses one prompt gets")
    value: str = option(
        "signal",
        'knapsack: the value it maximises, one of algorithms.allocation.KNAPSACK_VALUES: "signal" (expected '
        'groups with signal) or "information" (Knapsack RL: signal probability x p (1 - p)^2)',
    )
    skip_threshold: float = option(
        0.7, "skip: a prompt is skipped when its predicted zero-variance probability >= this"
    )
    explore: float = option(0.1, "probability that a candidate is scored as if unseen (its prediction checked again)")
    prior: list[float] = option(factory=lambda: [0.5, 0.5], help="Beta prior [a0, b0] of a prompt's pass rate")
    decay: float = option(0.5, "weight of earlier evidence at each new observation of a prompt, in (0, 1]")
    max_prompts: int = option(100_000, "prompts the statistics store remembers (least recently seen forgotten)")

    def __post_init__(self) -> None:
        check_field_types(self, "allocation")
        ALLOCATORS.check(self.method)
        check_number(self.candidates, "allocation.candidates", ge=1)
        require(
            self.method != "difficulty" or self.candidates > 1,
            "allocation.candidates",
            "method 'difficulty' picks prompts from a larger candidate set: set --allocation.candidates above 1 (e.g. 2)",
        )
        check_number(self.budget, "allocation.budget", gt=0)
        check_number(self.min_responses, "allocation.min_responses", integer=True, ge=2)
        check_number(self.max_responses, "allocation.max_responses", integer=True, ge=2)
        KNAPSACK_VALUES.check(self.value)
        require(
            self.max_responses >= self.min_responses,
            "allocation.max_responses",
            f"must be >= allocation.min_responses ({self.min_responses}), got {self.max_responses}",
        )
        check_number(self.skip_threshold, "allocation.skip_threshold", gt=0, le=1)
        check_number(self.explore, "allocation.explore", ge=0, le=1)
        require(
            isinstance(self.prior, list) and len(self.prior) == 2,
            "allocation.prior",
            f"must be a list [a0, b0] of two positive numbers, got {self.prior!r}",
        )
        for i, value in enumerate(self.prior):
            check_number(value, f"allocation.prior[{i}]", gt=0)
        check_number(self.decay, "allocation.decay", gt=0, le=1)
        check_number(self.max_prompts, "allocation.max_prompts", integer=True, ge=1)

    @property
    def enabled(self) -> bool:
        return self.method != "uniform"

    def candidate_count(self, prompts: int) -> int:
        """Prompts of the data order examined for ``prompts`` sampled ones: round(candidates x prompts), at least
        ``prompts`` (every method but ``uniform``; ``uniform`` examines exactly ``prompts``)."""
        return max(prompts, round(self.candidates * prompts)) if self.enabled else prompts

    def knapsack_budget(self, prompts: int, group_size: int) -> int:
        """The knapsack's responses for ``prompts`` groups of ``group_size``: B = max(min_responses, round(budget x
        prompts x group_size))."""
        return max(self.min_responses, round(self.budget * prompts * group_size))

    def responses_per_step(self, prompts: int, group_size: int) -> int:
        """Responses one allocation spends for ``prompts`` groups of ``group_size``: the knapsack's budget B with
        ``method`` knapsack; every other method prompts x group_size (``skip``: at most that)."""
        return self.knapsack_budget(prompts, group_size) if self.method == "knapsack" else prompts * group_size


# ---------------------------------------------------------------------------------------------------------
# Posterior predictions
# ---------------------------------------------------------------------------------------------------------


def beta_moment(a: float, b: float, k: int) -> float:
    """E[p^k] for p ~ Beta(a, b): prod_{j<k} (a + j) / (a + b + j) (1 for k = 0)."""
    out = 1.0
    for j in range(k):
        out *= (a + j) / (a + b + j)
    return out


def beta_mixed_moment(a: float, b: float, m: int, n: int) -> float:
    """E[p^m (1 - p)^n] for p ~ Beta(a, b) = B(a + m, b + n) / B(a, b) = E_{Beta(a, b)}[p^m] x E_{Beta(b, a + m)}[p^n]."""
    return beta_moment(a, b, m) * beta_moment(b, a + m, n)


def zero_variance_probability(a: float, b: float, k: int) -> float:
    """P(a group of k responses is all positive or all negative) = E[p^k] + E[(1 - p)^k]; 1 for k <= 1."""
    if k <= 1:
        return 1.0
    return min(1.0, beta_moment(a, b, k) + beta_moment(b, a, k))


def signal_probability(a: float, b: float, k: int) -> float:
    """P(a group of k responses holds both a positive and a negative) = 1 - E[p^k] - E[(1 - p)^k]; 0 for k <= 1."""
    return max(0.0, 1.0 - zero_variance_probability(a, b, k))


def information_value(a: float, b: float, k: int) -> float:
    """Knapsack RL's task value of a group of k: E[(1 - p^k - (1 - p)^k) p (1 - p)^2] under Beta(a, b)
    = M(1, 2) - M(k + 1, 2) - M(1, k + 2), M(m, n) = E[p^m (1 - p)^n]; 0 for k <= 1."""
    if k <= 1:
        return 0.0
    total = beta_mixed_moment(a, b, 1, 2) - beta_mixed_moment(a, b, k + 1, 2) - beta_mixed_moment(a, b, 1, k + 2)
    return max(0.0, total)


KnapsackValue = Callable[[float, float, int], float]
KNAPSACK_VALUES: Registry[KnapsackValue] = Registry("knapsack value", "allocation.value")
KNAPSACK_VALUES.register("signal")(signal_probability)
KNAPSACK_VALUES.register("information")(information_value)


# ---------------------------------------------------------------------------------------------------------
# Statistics store
# ---------------------------------------------------------------------------------------------------------


class PromptStatsStore:
    """Beta posterior of each prompt's pass rate, by prompt key, bounded to ``max_prompts`` keys (module docstring).

    Keys are strings (a prompt's identity, e.g. ``Row.key``), so that :meth:`state_dict` is plain JSON-able data."""

    def __init__(self, prior: Sequence[float] = (0.5, 0.5), decay: float = 1.0, max_prompts: int = 100_000) -> None:
        self.prior = (float(prior[0]), float(prior[1]))
        self.decay = float(decay)
        self.max_prompts = int(max_prompts)
        self._posteriors: OrderedDict[str, tuple[float, float, int]] = OrderedDict()  # key -> (a, b, observations)

    def __len__(self) -> int:
        return len(self._posteriors)

    def posterior(self, key: str) -> tuple[float, float]:
        """(a, b) of ``key``: the prior for a prompt never observed."""
        a, b, _ = self._posteriors.get(key, (*self.prior, 0))
        return a, b

    def observations(self, key: str) -> int:
        return self._posteriors.get(key, (0.0, 0.0, 0))[2]

    def observe(self, key: str, positives: int, total: int) -> None:
        """Add one group's outcome: ``positives`` of ``total`` responses (module docstring's update)."""
        if not 0 <= positives <= total:
            raise ValueError(f"observe: positives must lie in [0, total], got {positives} of {total}")
        a0, b0 = self.prior
        a, b, seen = self._posteriors.pop(key, (a0, b0, 0))
        a = a0 + self.decay * (a - a0) + positives
        b = b0 + self.decay * (b - b0) + (total - positives)
        self._posteriors[key] = (a, b, seen + 1)
        while len(self._posteriors) > self.max_prompts:
            self._posteriors.popitem(last=False)

    def state_dict(self) -> dict[str, Any]:
        """Plain data (lists, numbers, strings): the posteriors in least-recently-observed-first order."""
        return {"posteriors": [[k, a, b, n] for k, (a, b, n) in self._posteriors.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s data; ValueError naming the entry and field when it is damaged
        (:func:`check_store_state`)."""
        check_store_state(state)
        self._posteriors = OrderedDict(
            (str(k), (float(a), float(b), int(n))) for k, a, b, n in state.get("posteriors", [])
        )
        while len(self._posteriors) > self.max_prompts:
            self._posteriors.popitem(last=False)


def check_store_state(state: Any) -> None:
    """ValueError naming the field when ``state`` is not a store's :meth:`PromptStatsStore.state_dict`: a mapping
    whose ``posteriors`` is a list of ``[key, a, b, n]`` entries with a string key, finite a > 0 and b > 0 (Beta
    parameters: the prior plus non-negative counts) and an integer number of observations n >= 0."""
    if not isinstance(state, Mapping):
        raise ValueError(f"allocation store: expected a mapping with 'posteriors', got {type(state).__name__}")
    entries = state.get("posteriors", [])
    if not isinstance(entries, list):
        raise ValueError(f"allocation store: posteriors must be a list, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        where = f"allocation store: posteriors[{i}]"
        if not isinstance(entry, (list, tuple)) or len(entry) != 4:
            raise ValueError(f"{where}: expected [key, a, b, observations], got {entry!r:.80}")
        key, a, b, n = entry
        if not isinstance(key, str):
            raise ValueError(f"{where}: the key must be a string, got {key!r:.80}")
        for name, value in (("a", a), ("b", b)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{where}: {name} must be a finite number > 0 (a Beta parameter), got {value!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{where}: observations must be an integer >= 0, got {n!r}")


# ---------------------------------------------------------------------------------------------------------
# Allocators
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocationRequest:
    """What an allocator decides on: the candidates' posteriors (explored ones already replaced by the prior),
    ``prompts`` = prompts_per_step P and ``group_size`` = n."""

    posteriors: Sequence[tuple[float, float]]
    prompts: int
    group_size: int
    cfg: AllocationConfig


Allocator = Callable[[AllocationRequest], list[int]]
ALLOCATORS: Registry[Allocator] = Registry("allocator", "allocation.method")


def register_allocator(name: str) -> Callable[[Allocator], Allocator]:
    """Decorator: register an allocator ``fn(request) -> counts per candidate`` under ``name``."""

    return ALLOCATORS.register(name)


@register_allocator("uniform")
def uniform_allocation(req: AllocationRequest) -> list[int]:
    """n responses for each of the first P candidates."""
    return [req.group_size if i < req.prompts else 0 for i in range(len(req.posteriors))]


@register_allocator("skip")
def skip_allocation(req: AllocationRequest) -> list[int]:
    """In order, n responses for each candidate whose zero-variance probability z(n) < skip_threshold, up to P."""
    counts, kept = [], 0
    for a, b in req.posteriors:
        take = kept < req.prompts and zero_variance_probability(a, b, req.group_size) < req.cfg.skip_threshold
        counts.append(req.group_size if take else 0)
        kept += take
    return counts


@register_allocator("difficulty")
def difficulty_allocation(req: AllocationRequest) -> list[int]:
    """n responses for each of the P candidates with the highest signal probability s(n) (earlier wins ties)."""
    scores = [signal_probability(a, b, req.group_size) for a, b in req.posteriors]
    chosen = set(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: req.prompts])
    return [req.group_size if i in chosen else 0 for i in range(len(scores))]


@register_allocator("knapsack")
def knapsack_allocation(req: AllocationRequest) -> list[int]:
    """Greedy by value (``allocation.value``) gained per response under the budget B (module docstring).

    Each round takes the item of largest gain per response (earlier candidate on ties) among those that fit in
    what is left of B, have a positive gain, and do not open a prompt beyond the P-th. The candidates' next items
    wait in a heap: taking an item changes only its own candidate's next one, and an item that is refused stays
    refused (what is left of B and the number of prompts still to open only shrink), so a step costs
    O(B log C) value evaluations instead of O(B C)."""
    cfg = req.cfg
    budget = cfg.knapsack_budget(req.prompts, req.group_size)
    value = KNAPSACK_VALUES.get(cfg.value)
    counts = [0] * len(req.posteriors)
    heap: list[tuple[float, int, int]] = []  # (-gain per response, candidate, cost) of each candidate's next item

    def push_next_item(i: int) -> None:
        a, b = req.posteriors[i]
        k = counts[i]
        if k >= cfg.max_responses:
            return
        step = cfg.min_responses if k == 0 else 1
        gain = (value(a, b, k + step) - value(a, b, k)) / step
        if gain > 0:
            heapq.heappush(heap, (-gain, i, step))

    for i in range(len(counts)):
        push_next_item(i)
    spent = opened = 0
    while heap:
        _, i, cost = heapq.heappop(heap)
        if cost > budget - spent or (counts[i] == 0 and opened >= req.prompts):
            continue
        opened += counts[i] == 0
        counts[i] += cost
        spent += cost
        push_next_item(i)
    return counts


@dataclass(frozen=True)
class Allocation:
    """One step's decision: a count per candidate (0 = not sampled) and the metrics to log."""

    counts: list[int]
    metrics: dict[str, float]


def allocate(
    store: PromptStatsStore,
    keys: Sequence[str],
    prompts: int,
    group_size: int,
    cfg: AllocationConfig,
    rng: random.Random,
) -> Allocation:
    """Counts for the candidates ``keys`` (in data order) by ``cfg.method``, exploration applied (module docstring)."""
    if not keys:
        raise ValueError("allocate: no candidate prompts")
    posteriors = [store.prior if rng.random() < cfg.explore else store.posterior(k) for k in keys]
    counts = list(ALLOCATORS.get(cfg.method)(AllocationRequest(posteriors, prompts, group_size, cfg)))
    if len(counts) != len(keys) or any(c < 0 for c in counts):
        raise ValueError(
            f"allocator {cfg.method!r}: returned {counts!r} for {len(keys)} candidates; need one count >= 0 per candidate"
        )
    if not any(counts):
        best = max(range(len(keys)), key=lambda i: (signal_probability(*posteriors[i], group_size), -i))
        counts[best] = group_size
    sampled = [i for i, c in enumerate(counts) if c > 0]
    predicted = [signal_probability(*posteriors[i], counts[i]) for i in sampled]
    seen = sum(1 for k in keys if store.observations(k) > 0)
    return Allocation(
        counts=list(counts),
        metrics={
            "allocation/candidates": float(len(keys)),
            "allocation/prompts_sampled": float(len(sampled)),
            "allocation/prompts_skipped": float(len(keys) - len(sampled)),
            "allocation/responses_allocated": float(sum(counts)),
            "allocation/predicted_signal_fraction": math.fsum(predicted) / len(predicted) if predicted else 0.0,
            "allocation/candidates_seen_before": float(seen),
            "allocation/store_size": float(len(store)),
        },
    )


class RolloutAllocator:
    """The stateful side of allocation that a backend holds: chooses, per sampler call, which of its candidate prompts
    are sampled and with how many responses (:func:`allocate`, seeded by run seed, step and data position); holds the
    store (its :meth:`state_dict` goes into every checkpoint), learns from each sampled group (the positives among
    every response generated for the prompt) and sums the step's allocation metrics over the calls of a step
    (:meth:`pop_metrics`)."""

    def __init__(self, cfg: AllocationConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        self.store = PromptStatsStore(cfg.prior, cfg.decay, cfg.max_prompts)
        self._metrics: dict[str, float] = {}
        self._predicted: list[float] = []  # predicted signal fraction of each sampler call of the step

    def choose(self, keys: Sequence[str], prompts: int, group_size: int, step: int, position: int) -> Allocation:
        """The counts of the candidates ``keys`` (data positions ``position`` on) for a call that wants ``prompts`` groups."""
        rng = random.Random(f"allocation:{self.seed}:{step}:{position}")
        allocation = allocate(self.store, keys, prompts, group_size, self.cfg, rng)
        for name, value in allocation.metrics.items():
            if name == "allocation/store_size":
                self._metrics[name] = value
            elif name != "allocation/predicted_signal_fraction":
                self._metrics[name] = self._metrics.get(name, 0.0) + value
        self._predicted.append(allocation.metrics["allocation/predicted_signal_fraction"])
        return allocation

    def observe(self, keys: Sequence[str], result: SamplingResult) -> None:
        """Add each sampled group's pool (positives of every response generated for it) to the store; ``keys`` are the
        sampled prompts' keys in the sampler's prompt order."""
        for group in result.groups:
            self.store.observe(keys[group.prompt_index], group.pool_positives, len(group.pool_rewards))

    def pop_metrics(self) -> dict[str, float]:
        """The step's allocation metrics (counts summed over its sampler calls), then reset."""
        out = dict(self._metrics)
        if self._predicted:
            out["allocation/predicted_signal_fraction"] = sum(self._predicted) / len(self._predicted)
        self._metrics, self._predicted = {}, []
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.store.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store.load_state_dict(state)
