"""Evaluation: symbolic answer sets, query sampling, filtered ranking metrics, BetaE query files."""
