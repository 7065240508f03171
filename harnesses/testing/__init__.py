"""Test and bench aids installed with the package: hostile answers (`hostile_answers`), the reward-hack
corpus (`reward_hacks`) and two one-call OpenAI-SDK agents (`one_call_agents`)."""
