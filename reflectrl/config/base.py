"""The base of every configuration section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """The base of every section: unknown keys are errors, and each field's docstring is its
    description (the documentation's configuration reference is built from them)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
