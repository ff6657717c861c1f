"""Task calls: what a front end asks the chat model for itself, not a person's turn.

Open WebUI asks for a title, tags, follow-up suggestions, search queries, autocomplete, an
image prompt and an emoji; LibreChat for a conversation title. Each is a call of its own with
the chat history pasted into one user message. Such a call gets no memory block, no agent
run and no inline markers (CONTRACT section 22): the person's memory stays out of prompts
the person never sees, and the agent does not read the same "please remember" four times.

A call is a task call when it carries `X-Memory-Task` with a value (an Open WebUI connection
can send `X-Memory-Task: {{TASK}}`, empty on a person's turn), or, with `memory.tasks.detect`,
when its last user message opens with a task prompt as the front ends render it by default
(`OPENINGS`), or when a pattern of `memory.tasks.patterns` is found in that message.

A prompt is recognised by its whole opening lines as the front end writes them, never by a
word that a person could type: "### Task:" or "title" alone is a person's turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvmem.chat.main_call import message_text
from kvmem.config import TasksConfig

TASK_HEADER = "x-memory-task"
# Open WebUI's own task names (`TASKS` in open_webui/constants.py), which `{{TASK}}` sends:
# the `task` label of `kvmem_task_calls_total` is one of these, `pattern` or `other`, so a
# client cannot grow the number of series.
KNOWN_TASKS = frozenset(
    {
        "title_generation",
        "follow_up_generation",
        "tags_generation",
        "emoji_generation",
        "query_generation",
        "image_prompt_generation",
        "autocomplete_generation",
        "function_calling",
        "moa_response_generation",
    }
)
PATTERN_TASK = "pattern"
OTHER_TASK = "other"


@dataclass(frozen=True)
class Opening:
    """The first lines of a front end's default task prompt, as it sends them."""

    task: str
    text: str
    source: str


# Copied from the front ends' sources; `source` names where and which version.
OWUI = "Open WebUI 0.12.4, backend/open_webui/config.py"
OWUI_OLD = "Open WebUI 0.5-0.6, backend/open_webui/config.py"
AGENTS = "LibreChat (@librechat/agents src/utils/title.ts, d8751a6)"
OPENINGS = (
    Opening(
        "title_generation",
        "### Task:\nGenerate a concise title summarizing the chat history.\n",
        OWUI,
    ),
    Opening(
        "title_generation",
        "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n",
        OWUI_OLD,
    ),
    Opening(
        "tags_generation",
        "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history, "
        "along with 1-3 more specific subtopic tags.\n",
        OWUI,
    ),
    Opening(
        "follow_up_generation",
        "### Task:\nPredict 3-5 useful messages this user might naturally send next to advance "
        "their current objective.\n",
        OWUI,
    ),
    Opening(
        "follow_up_generation",
        "### Task:\nSuggest 3-5 relevant follow-up questions or prompts that the user might "
        "naturally ask next in this conversation as a **user**, based on the chat history, to "
        "help continue or deepen the discussion.\n",
        OWUI_OLD,
    ),
    Opening(
        "query_generation",
        "### Task:\nAnalyze the chat history to determine the necessity of generating search "
        "queries, in the given language.",
        OWUI,
    ),
    Opening(
        "autocomplete_generation",
        "### Task:\nYou are an autocompletion system. Continue the text in `<text>` based on the "
        "**completion type** in `<type>` and the given language.",
        OWUI,
    ),
    Opening(
        "image_prompt_generation",
        "### Task:\nGenerate a detailed prompt for am image generation task based on the given "
        "language and context.",
        OWUI,
    ),
    Opening(
        "emoji_generation",
        "Your task is to reflect the speaker's likely facial expression through a fitting "
        "emoji. Interpret emotions from the message and reflect their facial expression using "
        "fitting, diverse emojis",
        OWUI,
    ),
    Opening(
        "title_generation",
        "Provide a concise, 5-word-or-less title for the conversation, using title case "
        "conventions. Only return the title itself.\n\nConversation:\n",
        AGENTS,
    ),
    Opening(
        "title_generation",
        "Analyze this conversation and provide:\n1. The detected language of the conversation\n"
        "2. A concise title in the detected language (5 words or less, no punctuation or "
        "quotation)\n",
        AGENTS,
    ),
)


class TaskCalls:
    """Tells a front end's task calls from a person's turns (`memory.tasks`)."""

    def __init__(self, config: TasksConfig) -> None:
        self._openings = OPENINGS if config.detect else ()
        self._patterns = [re.compile(pattern) for pattern in config.patterns]

    def task_of(self, headers: Mapping[str, str], messages: Sequence[dict[str, Any]]) -> str | None:
        """The task this call is (its metric label), or None for a person's turn."""
        named = headers.get(TASK_HEADER, "").strip()
        if named:
            return named if named in KNOWN_TASKS else OTHER_TASK
        if not self._openings and not self._patterns:
            return None
        text = _last_user_text(messages)
        if text is None:
            return None
        opening = text.lstrip()
        for known in self._openings:
            if opening.startswith(known.text):
                return known.task
        if any(pattern.search(text) for pattern in self._patterns):
            return PATTERN_TASK
        return None


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str | None:
    """The text of the last user message (see `message_text`), or None if there is none."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return None
