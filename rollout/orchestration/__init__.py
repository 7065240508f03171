"""Orchestration: the fleet of engines and rollout workers, the router, the trace buffer, and the Ray cluster
helpers that start them."""
