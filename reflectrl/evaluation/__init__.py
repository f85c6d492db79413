"""Held-out evaluation: play episodes greedy and sampled, report success with intervals."""
