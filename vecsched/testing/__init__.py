"""Helpers for testing code that uses vecsched: Hypothesis strategies for random
hordes (:mod:`vecsched.testing.strategies`, needs the ``test`` extra)."""
