"""The one error type of bad input: every error the library raises for a value a user gave (an
argument, a request, a config, a checkpoint, a trace) is an `InputError`, a `ValueError` whose
message names the value and the limit it broke. The command line prints it as one line."""


class InputError(ValueError):
    """A value from outside (argument, request, file) that cannot be used; the message names it
    and the limit."""


class RequestError(InputError):
    """A request (or an engine setting) that cannot be served; the message names the value and
    the limit."""


class RequestFailed(RuntimeError):
    """A request the engine ended without finishing it (a step that raised while it ran alone,
    NaN logits, an abort): the message is the request's own reason, never a symptom of the
    missing result."""
