"""Temperature conversions. `convert` goes through Celsius."""

ABSOLUTE_ZERO_C = -273.15


def celsius_to_fahrenheit(c: float) -> float:
    return c * 9 / 5 + 32


def fahrenheit_to_celsius(f: float) -> float:
    return f - 32 * 5 / 9


def celsius_to_kelvin(c: float) -> float:
    return c - ABSOLUTE_ZERO_C


def kelvin_to_celsius(k: float) -> float:
    return k + ABSOLUTE_ZERO_C


_TO_C = {"C": lambda v: v, "F": fahrenheit_to_celsius, "K": kelvin_to_celsius}
_FROM_C = {"C": lambda v: v, "F": celsius_to_fahrenheit, "K": celsius_to_kelvin}


def convert(value: float, from_unit: str, to_unit: str) -> float:
    try:
        to_c, from_c = _TO_C[from_unit.upper()], _FROM_C[to_unit.upper()]
    except KeyError as exc:
        raise ValueError(f"unknown unit: {exc.args[0]}") from None
    celsius = to_c(value)
    if celsius < ABSOLUTE_ZERO_C:
        raise ValueError("below absolute zero")
    return from_c(celsius)
