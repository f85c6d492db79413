"""Learning diagnostics: scripts that each answer one question about what the players learn
or how they behave (docs/diagnostics.md); results in diagnostics/results/."""
