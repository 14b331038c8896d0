"""The one exception users see: a bad flag or input, printed as one line with exit status 2."""


class InputError(ValueError):
    """Invalid user input. The message names the flag and what is allowed."""
