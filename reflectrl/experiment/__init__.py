"""Ablation grids: variants x seeds of `reflectrl launch`, their results and plots."""
