"""Template filters of the review pages."""

from __future__ import annotations

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from experience.search_hits import MARK_END, MARK_START

register = template.Library()


@register.filter
def marked(snippet: str) -> SafeString:
    """A search snippet as HTML: the text escaped first, then its match marks turned into <mark>, so step
    content never becomes markup."""
    return mark_safe(escape(snippet).replace(MARK_START, "<mark>").replace(MARK_END, "</mark>"))  # noqa: S308


@register.filter
def get(mapping: dict, key: str):
    """`mapping|get:key`, for dicts keyed by a loop's or an include's variable."""
    return mapping.get(key) if hasattr(mapping, "get") else None
