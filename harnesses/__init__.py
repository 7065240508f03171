"""harnesses package."""
