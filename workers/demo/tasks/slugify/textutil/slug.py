import re
import unicodedata


def slugify(text: str, *, separator: str = "-", max_length: int | None = None) -> str:
    """Lowercase ASCII slug. Every run of characters that are not letters or digits becomes one
    separator, and the slug never starts or ends with a separator."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]", separator, ascii_text.lower())
    slug = slug.strip(separator)
    if max_length is not None:
        slug = slug[:max_length].rstrip(separator)
    return slug
