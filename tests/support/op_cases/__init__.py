"""Operator test cases by family, shared by tests/ops and the CPU sweep."""
