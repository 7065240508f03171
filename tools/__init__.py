"""The workshop: checks and measurements of the product (rollout/, trainer/, harnesses/), run from the
checkout with `python -m tools.<...>` and not in the wheel. The product never imports it."""
