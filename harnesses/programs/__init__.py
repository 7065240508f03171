"""Harness programs: plain async functions `harness(task: Task, agents: Agents, **options) -> Reward`
(harnesses/base.py), one per module, each with a preset in conf/harness/: `single_turn`, `solver_verifier`,
`solver_verifier_corrector`, `debate`, `orchestrator`, `compaction`, `majority_vote`, `selfplay`, `relay`,
`openai_agent` (an agent written against the OpenAI API, through the worker's gateway), `verifiers_env` (a
verifiers environment's own rollout) and `textarena_game` (a TextArena two-player game)."""
