"""argparse types the benchmark scripts share: a bad number is refused with the value and its
bounds, before anything runs.

    from bench_args import amount, count, seconds
    parser.add_argument("--rounds", type=count(1, 1000), default=7)
    parser.add_argument("--memory-gb", type=amount(1, 1024, " GB"), default=24)
    parser.add_argument("--min-block-s", type=seconds(0, 60), default=0.5)
"""

import argparse
import math


def count(low, high):
    """A whole number in [low, high]."""
    return _bounded(int, "a whole number", low, high, "")


def seconds(low, high):
    """A finite number of seconds in [low, high] (nan and inf refused)."""
    return _bounded(float, "a number of seconds", low, high, " seconds")


def amount(low, high, unit):
    """A finite number in [low, high] of `unit` (" GB", " MB"; nan and inf refused)."""
    return _bounded(float, "a number", low, high, unit)


def _bounded(convert, noun, low, high, unit):
    """The one parser behind each type: `convert` the text, then refuse a value that is not
    finite or lies outside [low, high], naming the text as given."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite {noun[2:]}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text.strip()} is outside {low} to {high}{unit}")
        return value
    return parse


def counts(low, high):
    """A comma-separated list of whole numbers, each in [low, high]."""
    one = count(low, high)

    def parse(text):
        parts = [part.strip() for part in text.split(",")]
        if "" in parts:
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item")
        return [one(part) for part in parts]
    return parse
