"""User verifier functions for tests/harnesses/test_verifiers.py and the file-task training test
(`task.params.verifier=tests.harnesses.user_verifiers:<name>`)."""

import os


def digits_match(completion, answer, metadata):
    """1 if the digits of the completion end with the gold answer's."""
    digits = "".join(c for c in completion if c.isdigit())
    return float(bool(answer) and digits.endswith(answer))


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
