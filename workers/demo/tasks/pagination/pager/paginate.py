from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    items: list
    number: int
    total_pages: int
    has_next: bool
    has_previous: bool


def total_pages(count: int, per_page: int) -> int:
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    # An empty list still has one (empty) page.
    return max(1, -(-count // per_page))


def paginate(items: list, *, page: int, per_page: int) -> Page:
    """Pages are numbered from 1. Asking for a page past the end raises ValueError."""
    pages = total_pages(len(items), per_page)
    if not 1 <= page <= pages:
        raise ValueError(f"page {page} out of range 1..{pages}")
    start = page * per_page
    chunk = items[start : start + per_page]
    return Page(
        items=chunk,
        number=page,
        total_pages=pages,
        has_next=page < pages,
        has_previous=page > 1,
    )
