"""Reading an answer out of a model's text: the last `<answer>` tag, else the last number."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# A number: optional minus (not when it is a binary minus right after a digit or
# letter, as in "5-3"), then digits with optional thousands commas, or a bare
# decimal such as ".5".
_NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w.])-)?\.\d+")


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
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip() or None
    if numeric_fallback:
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1].replace(",", "")
    return None
