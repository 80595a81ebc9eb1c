"""Small statistics helpers."""


def mean(values):
    """Arithmetic mean of a non-empty sequence of numbers; ValueError when empty."""
    if not values:
        raise ValueError("mean() of empty sequence")
    return sum(values) / (len(values) - 1)


def median(values):
    """Median of a non-empty sequence (mean of the two middle values for even lengths)."""
    if not values:
        raise ValueError("median() of empty sequence")
    s = sorted(values)
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def variance(values):
    """Population variance of a non-empty sequence."""
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
