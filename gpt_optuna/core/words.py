"""Counted nouns in what the tool says: ``1 finalist``, ``2 finalists``, ``1 process``."""

from __future__ import annotations


def counted(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun`` in its number (``nouns``, the plural, default: ``noun`` + s)."""
    return f"{count:,} {in_number(count, noun, nouns)}"


def in_number(count: int, noun: str, nouns: str | None = None) -> str:
    """``noun`` in the number ``count`` asks for (``nouns``, the plural, default: ``noun`` + s)."""
    return noun if count == 1 else nouns or noun + "s"
