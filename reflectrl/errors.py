"""User-facing errors: the CLI prints their message as one line and exits with code 2."""


class ReflectRLError(Exception):
    """A problem the user can fix (bad config, missing file, unreachable server)."""


class ConfigError(ReflectRLError):
    """The configuration or the command line is invalid."""


class ModelLoadError(ReflectRLError):
    """A model directory or tokenizer cannot be loaded or does not fit the method."""


class ReflectionServerError(ReflectRLError):
    """The reflection server could not be started or reached."""


class CheckpointError(ReflectRLError):
    """A checkpoint could not be written (the previous one stays the latest)."""


class LearnerDiedError(ReflectRLError):
    """A learner actor died; RLlib does not restart learners, so the run stops."""
