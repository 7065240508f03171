"""Tests of rollout/agents/: the agent client, the gateway, control tokens."""
