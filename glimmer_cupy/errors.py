"""Errors that carry one line for the user.

Everything raised on purpose at a boundary (a file, an argument, a request) derives from
GlimmerError; the CLI prints its message on one line and exits with status 2.
"""


class GlimmerError(Exception):
    """A problem with the user's input, described in one line."""


class GGUFError(GlimmerError):
    """A model file that cannot be read: missing, not GGUF, truncated, inconsistent."""


class UnsupportedError(GlimmerError):
    """A valid input that this library does not handle (architecture, tensor type)."""


class FetchError(GlimmerError):
    """A named model could not be fetched or failed its checksum."""
