"""The errors a user can cause, each answered with its message as one sentence (never a traceback).

Every layer raises these and every front end (the command line, the dashboard's pages) catches
them by these names: a model family, the audit and the pages all mean the same ``InputError``.
"""

from __future__ import annotations


class InputError(ValueError):
    """Text the model cannot take; the message says what to do."""


class ModelLoadError(RuntimeError):
    """A model folder that cannot be turned into a working model."""


class ConfigError(ValueError):
    """A configuration that cannot describe a working model."""


class TokenizerError(ValueError):
    """Text a tokenizer cannot encode, or a vocabulary file it cannot read."""


class TraceFormatError(ValueError):
    """A trace file that cannot be read back."""
