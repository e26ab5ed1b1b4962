"""Conversion between integers and Roman numerals (1..3999)."""

_PAIRS = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number: int) -> str:
    if not 0 < number < 4000:
        raise ValueError(f"out of range: {number}")
    out = []
    for value, symbol in _PAIRS:
        while number >= value:
            out.append(symbol)
            number -= value
    return "".join(out)


def from_roman(text: str) -> int:
    text = text.strip().upper()
    if not text or any(ch not in _VALUES for ch in text):
        raise ValueError(f"not a Roman numeral: {text!r}")
    total = 0
    for i, ch in enumerate(text):
        value = _VALUES[ch]
        # A smaller symbol before a larger one is subtracted (IV = 4, XC = 90).
        if i + 1 < len(text) and value <= _VALUES[text[i + 1]]:
            total -= value
        else:
            total += value
    return total
