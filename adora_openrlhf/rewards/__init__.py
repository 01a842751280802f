"""Verifiable rewards: one function per task, registered by the rows' ``source``.

``get_reward_fn(source)`` loads the task modules on first use: ``kk`` (Logic-RL Knights-and-Knaves),
``math`` (DAPO-Math, MATH500, AIME, AMC through math-verify) and ``geometry`` (Geometry3K, MathVista).
``openrlhf_reward.py`` is the file handed to OpenRLHF's ``--reward.remote_url``; ``adapters.py`` turns the same
rewards into TRL reward functions (:func:`as_trl_reward_func`) and verl's ``compute_score`` (:func:`as_verl_compute_score`).
"""

from adora_openrlhf.rewards.adapters import as_trl_reward_func, as_verl_compute_score
from adora_openrlhf.rewards.base import REWARD_FUNCTIONS, RewardFn, RewardResult, get_reward_fn, register_reward

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFn",
    "RewardResult",
    "as_trl_reward_func",
    "as_verl_compute_score",
    "get_reward_fn",
    "register_reward",
]
