"""The RL stage: the driver's iteration, RLlib's PPO configured with our RLModule and learner,
the curriculum coordinator, checkpoints, progress and failure handling."""
