"""Reading an answer out of a model's text: the last `<answer>` tag, else the last number.

Model text is hostile input: everything here is linear in its length (no regex
that rescans the text from every tag, as a lazy `<answer>(.*?)</answer>` over
50,000 unclosed tags would).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)
# A number: optional minus (not when it is a binary minus right after a digit or
# letter, as in "5-3"), then digits with optional thousands commas, or a bare
# decimal such as ".5".
_NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w.])-)?\.\d+")
# A whole answer that is one plain number: sign, digits (thousands commas allowed), decimals.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")
MAX_NUMBER_CHARS = 100


def is_plain_number(text: str) -> bool:
    """Whether `text` is one plain number of at most MAX_NUMBER_CHARS characters (no exponent,
    no words, no expression): the answer format of the numeric tasks."""
    return len(text) <= MAX_NUMBER_CHARS and _PLAIN_NUMBER.fullmatch(text) is not None


def is_number(text: str | None) -> bool:
    """Whether `text` is a finite number (commas allowed as thousands separators)."""
    if text is None:
        return False
    try:
        return Decimal(text.strip().replace(",", "")).is_finite()
    except InvalidOperation:
        return False


def extract_answer(text: str, numeric_fallback: bool = True) -> str | None:
    """The answer in a model's output text.

    Returns the stripped content of the last `<answer>...</answer>` tag; without
    a tag, and if `numeric_fallback`, the last number in the text (commas
    removed); otherwise None. An empty tag yields None.
    """
    if not text:
        return None
    content = _last_tag_content(text)
    if content is not None:
        return content.strip() or None
    if numeric_fallback:
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1].replace(",", "")
    return None


def _last_tag_content(text: str) -> str | None:
    """The text between the last `</answer>` and the last `<answer>` before it (tags in any case)."""
    last = None
    open_end = None
    for tag in _TAG.finditer(text):
        if not tag.group(1):
            open_end = tag.end()
        elif open_end is not None:
            last = (open_end, tag.start())
    return None if last is None else text[last[0] : last[1]]
