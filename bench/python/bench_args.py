"""argparse types the benchmark scripts share: a bad number is refused with the value and its
bounds, before anything runs.

    from bench_args import count, seconds
    parser.add_argument("--rounds", type=count(1, 1000), default=7)
    parser.add_argument("--min-block-s", type=seconds(0, 60), default=0.5)
"""

import argparse
import math


def count(low, high):
    """A whole number in [low, high]."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low} to {high}")
        return value
    return parse


def seconds(low, high):
    """A finite number of seconds in [low, high] (nan and inf refused)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low} to {high} seconds")
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
