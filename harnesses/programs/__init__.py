"""Harness programs: plain async functions `harness(task, agents, **options) -> reward` (single turn,
solver-verifier, debate, orchestrator, compaction, majority vote, self-play, relay, an OpenAI-API agent)."""
