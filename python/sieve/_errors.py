"""SieveError: a failed host API call, carrying the runtime's message and status."""
from ._capi import STATUS_NAMES


class SieveError(RuntimeError):
    """`str(e)` is the runtime's message (one line per problem); `e.status` the sieve_status."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "status %d" % self.status)
        super().__init__(message or self.status_name)


def check(status, last_error, handle):
    """Raise SieveError with `last_error(handle)` when `status` is not SIEVE_OK."""
    if status:
        raise SieveError(status, last_error(handle).decode(errors="replace"))
