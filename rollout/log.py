"""Logging: one format for tracerl's lines, the level from TRACERL_LOG_LEVEL (default INFO).

Library code (rollout/, trainer/, harnesses/) logs with `log = logging.getLogger(__name__)`, never
print. `setup_logging()` runs once per process: in the scripts' entry points and in the Ray actors
that log (Engine, Learner, RolloutWorker: their __init__). It gives the root logger one stderr
handler in FORMAT (Ray forwards an actor's stderr to the driver's terminal, prefixed with the actor)
and sets the rollout, trainer and harnesses loggers to the level; other libraries' records pass it
at WARNING and above, as Python's own last-resort handler lets them through (vLLM, Ray and
transformers keep their own handlers). Hydra's logging setup is off (conf/*.yaml), so it adds no
second format and no <job>.log file."""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"
LEVEL_ENV = "TRACERL_LOG_LEVEL"
PACKAGES = ("rollout", "trainer", "harnesses")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Stderr(logging.StreamHandler):
    """A handler on whatever sys.stderr is when a record comes (pytest swaps it per test)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


class _Ours(logging.Filter):
    """tracerl's records at their loggers' level; other libraries' at WARNING and above."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.partition(".")[0] in PACKAGES or record.levelno >= logging.WARNING


def log_level() -> str:
    """TRACERL_LOG_LEVEL (default INFO); ValueError naming the variable for any other value than LEVELS."""
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    if level not in LEVELS:
        raise ValueError(f"{LEVEL_ENV}={os.environ[LEVEL_ENV]!r} is not a log level: use one of {', '.join(LEVELS)}")
    return level


def setup_logging() -> None:
    """Give this process tracerl's log handler and level (again: replaces the one set before)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    handler.addFilter(_Ours())
    root.addHandler(handler)
    level = log_level()
    for name in PACKAGES:
        logging.getLogger(name).setLevel(level)
