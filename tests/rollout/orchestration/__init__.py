"""Tests of rollout/orchestration/: the fleet, the rollout worker, and harnesses that fail on purpose."""
