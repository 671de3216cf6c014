class ArborError(Exception):
    """An error the server (or the connection to it) reported.

    code is one of protocol v1's error codes ("unknown_env", "invalid_params",
    "restore_failed", ...). retryable says the same request may succeed later.
    infra marks a failure of Arbor itself rather than of the request or the
    agent: trainers should mask such episodes instead of scoring them.
    """

    def __init__(self, code, message, retryable=False, infra=False):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.retryable = retryable
        self.infra = infra

    def __repr__(self):
        return "ArborError(%r, %r, retryable=%r, infra=%r)" % (self.code, self.message, self.retryable, self.infra)


class ConnectionClosedError(ArborError):
    """The websocket closed (or never opened); pending calls fail with it."""

    def __init__(self, message):
        super().__init__("connection_closed", message, retryable=True, infra=True)


class BranchError(ArborError):
    """Some children of a branch could not be made.

    envs holds one entry per requested child: an Env, or None where that
    child failed; errors holds the matching ArborError or None. The children
    that were made are open: close them or use them.
    """

    def __init__(self, envs, errors):
        failed = [e for e in errors if e is not None]
        first = failed[0]
        super().__init__(first.code, "%d of %d children failed; first: %s" % (len(failed), len(errors), first.message),
                         first.retryable, infra=first.infra)
        self.envs = envs
        self.errors = errors
