"""Test and bench aids installed with the package: fault injection on the real stack."""
