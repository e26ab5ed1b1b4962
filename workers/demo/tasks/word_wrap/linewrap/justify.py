from .wrap import wrap


def _spread(line: str, width: int) -> str:
    words = line.split(" ")
    if len(words) == 1:
        return line
    gaps = len(words) - 1
    spaces = width - sum(len(w) for w in words)
    base, extra = divmod(spaces, gaps)
    out = words[0]
    for i, word in enumerate(words[1:]):
        out += " " * (base + (1 if i < extra else 0)) + word
    return out


def justify(text: str, width: int) -> list[str]:
    """Wrap, then pad every line but the last with spaces between words to exactly `width`."""
    lines = wrap(text, width)
    return [_spread(line, width) for line in lines[:-1]] + lines[-1:]
