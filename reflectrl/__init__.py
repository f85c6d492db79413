"""reflectrl: Reflect-RL (arXiv 2402.12621) on Ray/RLlib with a vLLM-served reflection model."""

__version__ = "0.1.0"
