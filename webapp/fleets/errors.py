from experience.errors import Conflict, TroveError


class StaleFencingToken(Conflict):
    """The caller's lease was superseded (expired and reclaimed, or released): it must stop using the sandbox."""

    code = "stale_fencing_token"


class NoCapacity(TroveError):
    status_code = 503
    code = "no_capacity"
