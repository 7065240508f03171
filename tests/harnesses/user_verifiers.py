"""User verifier functions for tests/harnesses/test_verifiers.py and the file-task training test
(`task.params.verifier=tests.harnesses.user_verifiers:<name>`)."""

import os


def digits_match(completion, answer, metadata):
    """1 if the digits of the completion end with the gold answer's."""
    digits = "".join(c for c in completion if c.isdigit())
    return float(bool(answer) and digits.endswith(answer))


def digit_fraction(completion, answer, metadata):
    """The share of the completion's non-space characters that are digits (a dense reward the
    tiny random model can get), scaled by metadata["terms"] / 3 so that metadata reaches here."""
    chars = [c for c in completion if not c.isspace()]
    return (sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0) * metadata["terms"] / 3


def where_am_i(completion, answer, metadata):
    """1 if it runs in another process than metadata["parent"]."""
    return float(os.getpid() != metadata["parent"])


def hang(completion, answer, metadata):
    while True:
        pass


def out_of_range(completion, answer, metadata):
    return 2.5


def two_arguments(completion, answer):
    return 1.0
