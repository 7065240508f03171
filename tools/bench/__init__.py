"""The benches: `python -m tools.bench.<name> [--quick]` from the repository root, each printing its
result as one JSON object on its last output line (`reference`: what they measure against)."""
