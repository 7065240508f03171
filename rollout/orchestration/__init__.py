"""Orchestration: the fleet of engines and rollout workers, the router, the trace buffer, the Ray cluster
helpers and actor placement, and fault injection on the real stack."""
