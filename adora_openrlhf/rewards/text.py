"""Text helpers shared by the graders, each linear in the length of the text it reads.

A regular expression such as ``<answer>(.*?)</answer>`` rescans the rest of the text from every opening tag,
so ``"<answer>" * n`` costs n^2 steps; these helpers use ``str.find`` from a position that only moves
forward instead.
"""

from __future__ import annotations


def last_tagged_block(text: str, open_tag: str, close_tag: str) -> str | None:
    """The contents of the last ``open_tag ... close_tag`` block, or None when there is none.

    Blocks are taken left to right, each from an opening tag to the first closing tag after it, and the scan
    goes on after that closing tag (what ``re.findall(open + "(.*?)" + close, text, re.DOTALL)[-1]`` returns).
    """
    last, position = None, 0
    while True:
        start = text.find(open_tag, position)
        if start < 0:
            return last
        inner = start + len(open_tag)
        end = text.find(close_tag, inner)
        if end < 0:
            return last
        last, position = text[inner:end], end + len(close_tag)


def has_nonempty_tagged_block(text: str, open_tag: str, close_tag: str) -> bool:
    """True when some ``open_tag`` is followed, after at least one character, by ``close_tag``
    (``re.search(open + ".+?" + close, text, re.DOTALL)``): the first opening tag decides, since any later
    one has fewer characters after it."""
    start = text.find(open_tag)
    return start >= 0 and text.find(close_tag, start + len(open_tag) + 1) >= 0
