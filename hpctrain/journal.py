"""Kept for imports written before hpctrain.run: the journal lives in hpctrain.run.events."""

from hpctrain.run.events import Journal  # noqa: F401
from hpctrain.run.jsonlines import JsonLines, read_jsonl  # noqa: F401
