"""Reward functions used by the training tests (loaded as user rewards by file path)."""


def long_text(completion: str, answer, meta) -> float:
    """Longer decoded text for the same number of tokens: a tiny random model can learn it."""
    return len(completion) / 100.0


def always_fails(completion: str, answer, meta) -> float:
    raise ZeroDivisionError("the toy reward always fails")
