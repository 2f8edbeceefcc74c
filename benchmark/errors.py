"""The one exception type users see: it names the problem and how to fix it."""


class DapbenchError(Exception):
    """A user-facing error: bad input, missing data, invalid configuration.

    The message always says what is wrong and what to do about it; the CLI prints it without a
    traceback and exits with status 2.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")
