"""Pagination helpers. Pages are numbered from 1."""


def paginate(items, page, per_page=10):
    """The items on page ``page`` (1-based); an empty list past the end.

    ValueError when page < 1 or per_page < 1.
    """
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be >= 1")
    start = page * per_page
    return list(items[start:start + per_page])


def page_count(n_items, per_page=10):
    """How many pages ``n_items`` items fill (0 items -> 0 pages)."""
    if per_page < 1:
        raise ValueError("per_page must be >= 1")
    return n_items // per_page
