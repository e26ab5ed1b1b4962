from .temperature import (
    celsius_to_fahrenheit,
    celsius_to_kelvin,
    convert,
    fahrenheit_to_celsius,
    kelvin_to_celsius,
)

__all__ = [
    "celsius_to_fahrenheit",
    "celsius_to_kelvin",
    "convert",
    "fahrenheit_to_celsius",
    "kelvin_to_celsius",
]
