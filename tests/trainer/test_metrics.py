"""The wandb trace table: the trace viewer's card for every sequence, and RunLogger logs it."""

import json

from rollout.trace import Sequence, Trace
from trainer.metrics import RunLogger, trace_table


def decode(ids):
    return " ".join(f"<{i}>" for i in ids)


TRACE = Trace("t<0>", "g", [Sequence([1, 2], [3, 4], [-0.1, -0.2], "solver", "main", 5),
                            Sequence([1, 2, 3, 4, 7], [8], [-0.3], "solver", "main", 6, parent=0),
                            Sequence([9], [10], [-0.4], "judge", "frozen", 0, trainable=False)], reward=1.0)


def test_trace_table_has_a_rendered_card_per_sequence():
    table = trace_table([TRACE], decode)
    assert table.columns[-1] == "view" and len(table.data) == 3
    assert [row[:5] for row in table.data] == [["t<0>", 0, "solver", "main", 5], ["t<0>", 1, "solver", "main", 6],
                                               ["t<0>", 2, "judge", "frozen", 0]]
    cards = [row[-1].html for row in table.data]
    assert 'class="tok generated"' in cards[0] and "row 1 (#0 → #1)" in cards[0]
    # the continuation shows only its new prompt token (<7>), not its parent's
    assert "⋯ 4 tokens: #0" in cards[1] and "&lt;7&gt;" in cards[1]
    assert "&lt;1&gt;" not in cards[1].split('class="seq')[1]
    assert "frozen: not trained" in cards[2] and 'class="tok masked"' in cards[2]


def test_run_logger_logs_the_table_offline(tmp_path):
    logger = RunLogger(tmp_path, "wandb", "offline", "tracerl-test", "metrics", {})
    logger.traces(3, [TRACE], decode)
    logger.close()
    [table] = tmp_path.glob("wandb/offline-run-*/files/media/table/rollout/traces_*.table.json")
    assert json.loads(table.read_text())["columns"][-1] == "view"
