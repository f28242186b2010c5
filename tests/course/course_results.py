"""What the course tests share: reading a failed check."""

from fvlib.course import CheckResult


def failed_with(result: CheckResult, diagnosis: str | None = None, *words: str) -> bool:
    text = str(result).lower()
    ok = not result and text.startswith("not yet") and all(w.lower() in text for w in words)
    return ok and (diagnosis is None or result.details.get("diagnosis") == diagnosis)
