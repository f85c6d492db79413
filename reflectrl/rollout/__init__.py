"""What a rollout worker runs, for RL's EnvRunners and held-out eval alike: the vector env of
text envs, their reflections and prompts, built from the config."""
