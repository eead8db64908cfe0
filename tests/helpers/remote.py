"""``kind: remote`` in tests: the items a remote component (another server, an OpenAI chat
endpoint as a judge) is asked to score, its prompt template, and an API key that must never
be shown."""

from __future__ import annotations

QUERIES = ["What is 2 + 2?", "Name a colour.", "Say something long about the movie please."]
RESPONSES = ["4", "the red fox jumps over the lazy dog", "boring"]
LABELS = ["4", "blue", "boring"]
TEMPLATE = "Question: {{ prompt }}\nAnswer: {{ response }}\nReference: {{ label }}\nScore 1-9:"
#: The remote's API key: in no answer, log or error.
SECRET = "sk-test-not-to-be-shown-7c1e"
