"""Test and bench aids installed with the package: hostile answers, a reward-hack corpus, one-call agents."""
