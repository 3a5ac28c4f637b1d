"""Errors that mean "bad input", reported as one line and exit code 2, never a traceback."""


class InputError(Exception):
    """Something the user gave us (a URL, a file, a payload) cannot be used."""
