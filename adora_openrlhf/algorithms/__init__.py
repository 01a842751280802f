"""Engine-free algorithm core: tensors and small dataclasses in, tensors out. No engine imports here."""

from adora_openrlhf.algorithms.adora import (
    GROUP_RULES,
    AdoraResult,
    adora_weights,
    apply_group_weights,
    classify_groups,
    length_shaped_rewards,
    register_rule,
)
from adora_openrlhf.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    GroupStats,
    PoolStats,
    broadcast_to_tokens,
    compute_group_advantages,
    register_estimator,
)
from adora_openrlhf.algorithms.sampling import (
    EXIT_RULES,
    AdaptiveSampler,
    GenerationRequest,
    PromptGroup,
    SamplingResult,
    ScoredResponse,
    escalated_params,
    register_exit_rule,
)
from adora_openrlhf.algorithms.token_advantages import (
    TOKEN_ESTIMATORS,
    TokenAdvantages,
    compute_token_advantages,
    register_token_estimator,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "EXIT_RULES",
    "GROUP_RULES",
    "AdaptiveSampler",
    "AdoraResult",
    "GenerationRequest",
    "GroupStats",
    "PoolStats",
    "PromptGroup",
    "SamplingResult",
    "TOKEN_ESTIMATORS",
    "TokenAdvantages",
    "ScoredResponse",
    "adora_weights",
    "apply_group_weights",
    "broadcast_to_tokens",
    "classify_groups",
    "compute_group_advantages",
    "compute_token_advantages",
    "escalated_params",
    "length_shaped_rewards",
    "register_estimator",
    "register_exit_rule",
    "register_rule",
    "register_token_estimator",
]
