"""Text helpers."""


def slugify(text):
    """A URL slug of ``text``.

    Rules: lowercase; every run of characters that are not ASCII letters or digits becomes a
    single "-"; no leading or trailing "-". slugify("Hello, World!") == "hello-world".
    """
    raise NotImplementedError
