"""Splitting a shell command line into words, as `shlex` does, but cheaply for the usual command.

The rubric reads every command a run executed, and `shlex` is pure Python, a character at a time: it was
most of the rubric's cost. `split_words(text)` gives exactly the words of

    lexer = shlex.shlex(text, posix=True, punctuation_chars=True); lexer.whitespace_split = True

(falling back to `text.split()` when shlex refuses the text, e.g. an unbalanced quote in a truncated
command). Most commands hold no quote, escape or comment (`cd /repo && python -m pytest tests/a.py 2>&1 |
tail -20`); for those, shlex's words are the maximal runs of punctuation characters `();<>|&` and of the
other non-whitespace characters (its whitespace is ` \\t\\r\\n` only), which one regular expression finds.
Balanced quotes without escapes (`sed -i 's/a(/b(/' x.py`, `python -c "import a"`) are read by a second
expression: a word is then a run of unquoted characters and whole quoted strings, with the quotes dropped.
A comment (`#`) in a text with no quote or escape ends the word it interrupts and runs to the end of its
line, as shlex reads it (even mid-word: `a#b` is `a`), so it is cut out before the plain split. Anything
else (an escape, a comment beside a quote, an unclosed quote) goes to shlex. Results are cached per
distinct command string: agents rerun the same commands, and a build reads each run's.
"""

from __future__ import annotations

import functools
import re
import shlex

# Characters that change shlex's words beyond the plain split: quotes, the escape, the comment start.
_NOT_PLAIN = re.compile(r"['\"\\#]")
_NEEDS_SHLEX = re.compile(r"[\\#]")
_QUOTE_OR_ESCAPE = re.compile(r"['\"\\]")
# A comment as shlex reads one: from `#` to the end of its line (its readline stops at \n only).
_COMMENT = re.compile(r"#[^\n]*")
# shlex's words when none of those occurs: runs of its punctuation characters, runs of anything else
# that is not its whitespace.
_PLAIN_WORD = re.compile(r"[();<>|&]+|[^ \t\r\n();<>|&]+")
# With quotes but no escape or comment: a punctuation run, a word (unquoted characters and whole quoted
# strings), or a quote that is never closed (a token of its own, which no word can be: shlex refuses the
# text). Whitespace separates them and is not a token.
_QUOTED_TOKEN = re.compile(r"""[();<>|&]+|(?:[^ \t\r\n();<>|&'"]|'[^']*'|"[^"]*")+|['"]""")
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def split_words(text: str) -> list[str]:
    """The words shlex (posix, punctuation characters, whitespace split) reads from `text`."""
    return list(_cached_words(text))


@functools.lru_cache(maxsize=16384)
def _cached_words(text: str) -> tuple[str, ...]:
    if _NOT_PLAIN.search(text) is None:
        return tuple(_PLAIN_WORD.findall(text))
    if _QUOTE_OR_ESCAPE.search(text) is None:  # then it holds a comment, and nothing else shlex reads
        return tuple(_PLAIN_WORD.findall(_COMMENT.sub("", text)))
    if _NEEDS_SHLEX.search(text) is None:
        words = _quoted_words(text)
        if words is not None:
            return words
    return tuple(shlex_words(text))


def _quoted_words(text: str) -> tuple[str, ...] | None:
    """shlex's words of a text with quotes but no escape or comment; None if a quote is never closed."""
    tokens = _QUOTED_TOKEN.findall(text)
    if "'" in tokens or '"' in tokens:
        return None
    return tuple([_unquoted(token) if "'" in token or '"' in token else token for token in tokens])


def _unquoted(word: str) -> str:
    """A word with each quoted string replaced by its text."""
    single, double = "'" in word, '"' in word
    if single and double:
        return _QUOTED.sub(_quoted_text, word)  # one kind may be inside the other's string
    # With one kind of quote, every one of them opens or closes a string.
    if single:
        return word.replace("'", "")
    return word.replace('"', "") if double else word


def _quoted_text(quoted: re.Match[str]) -> str:
    return quoted[1] if quoted[1] is not None else quoted[2]


def shlex_words(text: str) -> list[str]:
    """The reference: shlex's words, or plain whitespace-separated words when shlex refuses the text
    (unbalanced quotes: plain words still find most runners and paths)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return text.split()
