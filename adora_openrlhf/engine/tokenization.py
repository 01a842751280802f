"""Tokenizers and prompt templates for the local backend.

The tiny model gets a real tokenizer made on the spot: a byte-level BPE (the ``tokenizers`` library, the
same algorithm as GPT-2/Qwen tokenizers) trained on the task corpus, wrapped in a
``transformers.PreTrainedTokenizerFast`` and saved with the run. Byte-level BPE can encode any text, so
responses the model writes always round-trip.

Prompt templates (registry :data:`PROMPT_TEMPLATES`) turn a row's ``prompt`` (chat messages or a string)
into the text the model continues:

- ``compact``: the user message only, then a newline. Short prompts keep the tiny CPU model fast.
- ``chat``: the tokenizer's own chat template with the generation prompt (for real checkpoints).
- ``auto``: ``chat`` when the tokenizer has a chat template, otherwise ``compact``.

A tiny tokenizer built for a text task whose prompts are rendered ``compact`` carries
:data:`COMPACT_CHAT_TEMPLATE`, a chat template that renders exactly what ``compact`` does, so every later
user of the saved tokenizer (``auto`` on resume, OpenRLHF's ``--data.apply_chat_template``, vLLM) gives the
model the prompt text it was trained on.
"""

from __future__ import annotations

from collections.abc import Iterable

EOS_TOKEN = "<|endoftext|>"
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")  # atomic tokens, decoded back as plain text


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE tokenizer with ``vocab_size`` entries trained on ``texts``.

    ``<|endoftext|>`` is the eos and pad token; the four Logic-RL tags are single (non-special) tokens so
    they survive ``skip_special_tokens`` decoding. Normalisation (NFC) and pre-tokenisation (Qwen2's split
    pattern, which makes every digit a token of its own, then byte-level) are those of ``Qwen2Tokenizer``:
    a checkpoint directory holds a Qwen2 ``config.json``, so ``AutoTokenizer`` loads the saved tokenizer as a
    ``Qwen2Tokenizer``, which rebuilds that pipeline around the saved vocabulary and merges. Trained with the
    same pipeline, the tokenizer a run trains with and the one every later load gets (resume, warm starts,
    ``eval.run``, vLLM) give the same token ids.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    reserved = 1 + len(TAG_TOKENS)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + reserved:
        raise ValueError(
            f"model.tiny.vocab_size: must be >= {len(alphabet) + reserved} (bytes + special tokens), got {vocab_size}"
        )
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=[EOS_TOKEN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    tokenizer.add_tokens(list(TAG_TOKENS))
    return tokenizer


# the compact template as a chat template: the last user message, stripped (Jinja's trim is str.strip), and a newline
COMPACT_CHAT_TEMPLATE = (
    "{%- set users = messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list -%}"
    "{%- if not users %}{{ raise_exception('prompt: no user message to build a compact prompt from') }}{% endif -%}"
    "{{ users[-1] | trim }}{{ '\\n' }}"
)


def load_tokenizer(path: str, init_kwargs=None):
    """A saved tokenizer (the run's own, or a Hugging Face checkpoint's: local directory or hub name); sets a pad
    token if missing. ``init_kwargs``: ``model.init_kwargs``, of which the file-selecting ones apply."""
    from transformers import AutoTokenizer

    from adora_openrlhf.engine.model_source import loader_kwargs

    tokenizer = AutoTokenizer.from_pretrained(path, **loader_kwargs(init_kwargs))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"model.path: the tokenizer at {path!r} has neither a pad nor an eos token; add one to its tokenizer_config.json"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


TOKENIZER_PROBE = "Alice is a knight. 12 + 30 = 42"


def tokenizer_problem(tokenizer) -> str | None:
    """What is wrong with a loaded tokenizer (None when nothing is): a directory without tokenizer files loads as
    a tokenizer that encodes every text to no tokens."""
    if not tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]:
        return (
            "there are no tokenizer files in it (tokenizer.json, or vocab.json and merges.txt): the tokenizer loaded from it encodes text to no tokens; "
            "copy the tokenizer files of the model it was made from into it"
        )
    return None
