"""CLI commands of this area."""


def groups() -> list:
    """Click groups this area adds to ``flask --app wsgi``."""
    return []
