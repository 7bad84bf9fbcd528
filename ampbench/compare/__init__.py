"""Comparing the arms: pairing, ratios and intervals (analysis.py, stats.py), the report."""
