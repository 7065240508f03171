"""rollout/log.py: tracerl's lines in one format on stderr at TRACERL_LOG_LEVEL; other libraries' from WARNING."""

import logging

import pytest

from rollout import log as tracerl_log

pytestmark = pytest.mark.unit


@pytest.fixture
def logging_set_up(monkeypatch):
    """setup_logging() for the test, and the root logger and package levels as they were after it."""
    root = logging.getLogger()
    handlers, levels = list(root.handlers), {n: logging.getLogger(n).level for n in tracerl_log.PACKAGES}
    yield lambda: tracerl_log.setup_logging()
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_tracerl_lines_pass_at_the_level_in_one_format_and_others_from_warning(logging_set_up, monkeypatch, capsys):
    monkeypatch.setenv("TRACERL_LOG_LEVEL", "info")
    logging_set_up()
    logging_set_up()  # again: still one handler
    logging.getLogger("trainer.metrics").info("[train] step 1/1")
    logging.getLogger("rollout.engine.engine").debug("not at INFO")
    logging.getLogger("somelib").setLevel(logging.INFO)
    logging.getLogger("somelib").info("a library's chatter")
    logging.getLogger("somelib").warning("a library's warning")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "I trainer.metrics: [train] step 1/1",
        "W somelib: a library's warning",
    ]


def test_a_bad_level_names_the_variable(monkeypatch):
    monkeypatch.setenv("TRACERL_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="TRACERL_LOG_LEVEL='LOUD' is not a log level: use one of DEBUG, INFO"):
        tracerl_log.log_level()
