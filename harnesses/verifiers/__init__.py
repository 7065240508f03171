"""Scoring: the answer grammar (`answers`), exact expression checks (`expressions`), the built-in verifiers
by name (`registry`), user verifiers (`user`) run in the sandbox (`sandbox`, `sandbox_isolation`), the LLM
judge (`judge`) and the plumbing that settles a judged reward (`scoring`)."""
