"""The user's room: `base.py` (the harness API: TaskSource, Task, load_harness, the Agent protocols), the
harness programs (`programs/`), the task sources (`tasks/`), and the verifiers with the answer grammar and the
sandbox (`verifiers/`)."""
