"""Reward functions for the offline-trainer tests (loaded as user rewards by file path)."""


def even_length(completion: str, answer, meta) -> float:
    """1 for a reply of even length: about half the samples of a random model pass."""
    return 1.0 if len(completion) % 2 == 0 else 0.0
