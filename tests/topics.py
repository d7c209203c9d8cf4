"""The book's topic modules and every exercise checker they hold, for the tests that go over all of them."""

import inspect

from selfattn.book import (
    decoding,
    multi_head,
    performance,
    pitfalls,
    positional_encoding,
    pretrained,
    single_head,
    tagging,
)

TOPICS = (tagging, single_head, positional_encoding, multi_head, pitfalls, performance, pretrained, decoding)

# every exercise checker of the book, by name: check_... of a topic module, defined there
CHECKERS = {name: fn for module in TOPICS for name, fn in vars(module).items()
            if name.startswith("check_") and inspect.isfunction(fn) and fn.__module__ == module.__name__}
