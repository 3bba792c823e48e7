"""The error a bad configuration value, key or file raises, below every module that checks one (the typed
configs, the size bounds), so that none of them imports another for it."""


class ConfigError(ValueError):
    """A configuration value, key or file is invalid; the message names the fix."""
