"""The project's exception hierarchy: one root, and user errors that print as one line."""


class GptOptunaError(Exception):
    """Root of every exception raised on purpose by gpt_optuna."""


class UserError(GptOptunaError):
    """Bad input from the user: the CLI prints the message as one line and exits non-zero."""


class MissingDependencyError(UserError):
    """A library a backend needs is not installed; the message names the extra that installs it."""

    def __init__(self, library: str, extra: str) -> None:
        super().__init__(f"{library} is not installed; install it with: pip install 'gpt-optuna[{extra}]'")
        self.library = library
        self.extra = extra
