"""Observation -> prompt -> token ids: the method's prompts, their rendering to a token budget,
and the label tokens (used by RL, data and eval alike)."""
