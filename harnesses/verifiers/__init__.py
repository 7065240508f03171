"""Scoring: the answer grammar, exact expression checks, the built-in verifier registry, user verifiers run
in the sandbox, the LLM judge and the scoring plumbing that settles a judged reward."""
