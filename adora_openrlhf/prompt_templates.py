"""Prompt templates: a row's ``prompt`` (chat messages or a string) as the text the model continues.

The registry :data:`PROMPT_TEMPLATES` (setting ``data.prompt_template``):

- ``compact``: the last user message, then a newline. Short prompts keep the tiny CPU model fast.
- ``chat``: the tokenizer's own chat template with the generation prompt (for real checkpoints).
- ``auto``: ``chat`` when the tokenizer has a chat template, otherwise ``compact``.

Register another with :func:`register_template`; a template is ``fn(row prompt, tokenizer) -> text``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from adora_openrlhf.registry import Registry

PromptTemplate = Callable[[Any, Any], str]  # (row prompt, tokenizer) -> text
PROMPT_TEMPLATES: Registry[PromptTemplate] = Registry("prompt template", "data.prompt_template")


def register_template(name: str) -> Callable[[PromptTemplate], PromptTemplate]:
    """Register a template ``fn(row prompt, tokenizer) -> text``."""
    return PROMPT_TEMPLATES.register(name)


def _messages(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and all(isinstance(m, dict) and "content" in m for m in prompt):
        return list(prompt)
    raise ValueError("prompt: expected a string or a list of chat messages {'role': ..., 'content': ...}")


@register_template("compact")
def compact_template(prompt: Any, tokenizer: Any = None) -> str:
    """The last user message followed by a newline (system messages are dropped)."""
    users = [m["content"] for m in _messages(prompt) if m.get("role", "user") == "user"]
    if not users:
        raise ValueError("prompt: no user message to build a compact prompt from")
    return users[-1].strip() + "\n"


@register_template("chat")
def chat_template(prompt: Any, tokenizer: Any) -> str:
    """The tokenizer's chat template applied to the messages, with the assistant generation prompt."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "data.prompt_template: 'chat' needs a tokenizer with a chat template; use 'compact' for this model"
        )
    return tokenizer.apply_chat_template(_messages(prompt), add_generation_prompt=True, tokenize=False)


@register_template("auto")
def auto_template(prompt: Any, tokenizer: Any) -> str:
    """``chat`` when the tokenizer has a chat template, else ``compact``."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return chat_template(prompt, tokenizer)
    return compact_template(prompt, tokenizer)


def render_prompt(prompt: Any, tokenizer: Any, template: str) -> str:
    return PROMPT_TEMPLATES.get(template)(prompt, tokenizer)
