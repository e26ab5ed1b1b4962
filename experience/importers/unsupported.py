"""Formats people hold runs in that Trove does not import yet, recognised so the error names them.

`identify(path, head)` returns a name such as "a Gemini CLI log" or None. Each check reads only the file's
name and its first megabyte, and is strict enough not to claim a file some importer reads (detection asks
it only after every importer has declined).
"""

from __future__ import annotations

import re
from pathlib import Path

_AIDER_HEADING = re.compile(rb"^\s*# aider chat started at ", re.MULTILINE)
_GEMINI_LOG = re.compile(rb'^\s*\[\s*\{\s*"sessionId"\s*:\s*"[^"]*"\s*,\s*"messageId"\s*:')
_GEMINI_CHAT = re.compile(rb'"sessionId"\s*:.{0,2000}?"projectHash"\s*:', re.DOTALL)
_GEMINI_TURN = re.compile(rb'"type"\s*:\s*"gemini"')
# Qwen Code's session lines: Claude Code's envelope (sessionId, parentUuid, ...) around a Gemini message or a
# system payload (claude_code.detect declines them)
_QWEN_LINE = re.compile(rb'^\s*\{"uuid"\s*:.{0,600}?"sessionId"\s*:.{0,2000}?("message"\s*:\s*\{\s*"role"\s*:\s*"(user|model)"'
                        rb'\s*,\s*"parts"|"systemPayload"\s*:)')
_LANGSMITH = re.compile(rb'"run_type"\s*:\s*"(llm|chain|tool)"')

# Dotfiles a tool writes where people keep their work: an import of that folder reads them, though it skips
# other hidden files, so the answer names the format rather than finding nothing.
DOTFILE_NAMES = frozenset({".aider.chat.history.md"})

KNOWN = {
    "aider": "an aider chat history (.aider.chat.history.md)",
    "gemini_log": "a Gemini CLI log (~/.gemini/tmp/<project>/logs.json)",
    "gemini_chat": "a Gemini CLI saved chat (~/.gemini/tmp/<project>/chats/*.json or *.jsonl)",
    "langsmith": "a LangSmith run export",
    "qwen_code": "a Qwen Code session (~/.qwen/projects/<project>/chats/*.jsonl)",
}


def identify(path: Path, head: bytes) -> str | None:
    """The name of the unsupported format the file looks like, or None."""
    if path.name.endswith(".aider.chat.history.md") or _AIDER_HEADING.search(head[:4096]):
        return KNOWN["aider"]
    if _GEMINI_LOG.match(head):
        return KNOWN["gemini_log"]
    if _GEMINI_CHAT.search(head[:65536]) and _GEMINI_TURN.search(head):
        return KNOWN["gemini_chat"]
    if _QWEN_LINE.match(head):
        return KNOWN["qwen_code"]
    if head.lstrip()[:1] in (b"{", b"[") and _LANGSMITH.search(head[:65536]):
        return KNOWN["langsmith"]
    return None
