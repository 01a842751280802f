"""The package's user-error type, shared by the config and the registries without an import between them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""
