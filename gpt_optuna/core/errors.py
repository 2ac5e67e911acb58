"""The project's exception hierarchy: one root, and user errors that print as one line."""

EXIT_REGRESSION = 1
"""``check``: the model regressed (slower beyond the tolerance, or accuracy lost)."""
EXIT_USER_ERROR = 2
EXIT_NO_FEASIBLE = 3
"""The exit code of a search that finished without any feasible candidate."""
EXIT_INTERNAL = 4
"""An internal error (a bug of ours): the traceback is printed."""
EXIT_INCONCLUSIVE = 5
"""``check``: the latency could not be decided on this host (too noisy, or out of budget): neither a
pass nor a regression."""


class GptOptunaError(Exception):
    """Root of every exception raised on purpose by gpt_optuna."""


class UserError(GptOptunaError):
    """Bad input from the user: the CLI prints the message as one line and exits non-zero."""


class MissingDependencyError(UserError):
    """A library a backend needs is not installed; the message names the extra that installs it."""

    def __init__(self, library: str, extra: str) -> None:
        super().__init__(f"{library} is not installed; install it with: pip install 'gpt-optuna[{extra}]'")


def environment_fault(exc: BaseException) -> str | None:
    """One line for a fault of the machine rather than of the program (a full disk, a read-only
    file system, a missing permission) anywhere in the exception's chain; None for anything else."""
    import errno

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, OSError) and current.errno == errno.ENOSPC or "database or disk is full" in text:
            return f"no space left on the device: {_where(current)}"
        if isinstance(current, OSError) and current.errno == errno.EROFS or "readonly database" in text:
            return f"the file system is read-only: {_where(current)}"
        if isinstance(current, PermissionError):
            return f"permission denied: {_where(current)}"
        current = current.__cause__ or current.__context__
    return None


def _where(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return str(exc.filename)
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
