"""Argument checks and helpers shared by the layers."""


def check_positive_int(name, value, allow_none=False):
    """Raises `ValueError` naming `name` unless `value` is a positive int."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value}"
        )


def check_rate(name, value):
    """Raises `ValueError` naming `name` unless `0 <= value < 1`."""
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value}"
        )


def clone_initializer(initializer):
    """A fresh copy, so sublayers do not share one (stateless) initializer."""
    return initializer.__class__.from_config(initializer.get_config())


def check_positive_number(name, value):
    """Raises `ValueError` naming `name` unless `value` is a number > 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive number. Received: {name}={value}"
        )
