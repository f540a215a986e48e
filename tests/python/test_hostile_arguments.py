"""Errors that stay what they are: an argument whose own code raises while spillarena checks it
gives InvalidArgumentError only for TypeError, ValueError and OverflowError; KeyboardInterrupt,
MemoryError, SystemExit and the rest reach the caller as themselves (Note [Only a bad argument
becomes another error] in python/src/py.h). And one numeric conversion for every option (Note
[One numeric conversion for every option] in python/src/binding.h)."""

import fractions
import math

import pytest
import torch

import spillarena

NOT_OURS = [KeyboardInterrupt, MemoryError, SystemExit, RuntimeError]
BAD_ARGUMENT = [TypeError, ValueError, OverflowError]


def raising(error, *methods):
    """An object whose ``methods`` raise ``error``."""
    def fail(*_):
        raise error("raised by the argument itself")
    return type(f"Raises{error.__name__}", (), dict.fromkeys(methods, fail))()


def index_raising(error):
    return raising(error, "__index__")


def calls(spill_dir):
    """Each entry point that checks an argument, called with ``bad`` in one place."""
    return {
        "SpillArena capacity": lambda bad: spillarena.SpillArena(bad, spill_dir),
        "SpillArena keep_last": lambda bad: spillarena.SpillArena(1 << 20, spill_dir,
                                                                  keep_last=bad),
        "SpillArena growth_margin": lambda bad: spillarena.SpillArena(1 << 20, spill_dir,
                                                                      growth_margin=bad),
        "AutomaticArena growth_margin": lambda bad: spillarena.AutomaticArena(spill_dir,
                                                                              growth_margin=bad),
        "AutomaticArena layers": lambda bad: spillarena.AutomaticArena(spill_dir, layers=bad),
        "bytes_for_layer_inputs layers": lambda bad: spillarena.bytes_for_layer_inputs(
            bad, (1, 2, 3), torch.float32),
        "bytes_for_layer_inputs batch": lambda bad: spillarena.bytes_for_layer_inputs(
            2, (bad, 2, 3), torch.float32),
    }


CALLS = sorted(calls(None))


@pytest.mark.parametrize("error", NOT_OURS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", CALLS)
def test_what_an_index_raises_that_is_not_a_bad_argument_comes_out_as_itself(
        call, error, spill_dir):
    with pytest.raises(error, match="raised by the argument itself") as caught:
        calls(spill_dir)[call](index_raising(error))
    assert not isinstance(caught.value, spillarena.Error)


@pytest.mark.parametrize("error", BAD_ARGUMENT, ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", CALLS)
def test_a_bad_argument_is_still_an_invalid_argument_error(call, error, spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError, match="must be"):
        calls(spill_dir)[call](index_raising(error))


@pytest.mark.parametrize("error", NOT_OURS, ids=lambda e: e.__name__)
def test_what_a_path_raises_comes_out_as_itself(error, spill_dir):
    for bad in (raising(error, "__fspath__"), raising(error, "__getattr__")):
        for call in (spillarena.make_per_file_stash, spillarena.AutomaticArena,
                     lambda directory: spillarena.SpillArena(1 << 20, directory)):
            with pytest.raises(error, match="raised by the argument itself"):
                call(bad)


def test_a_path_whose_fspath_raises_a_type_error_is_an_invalid_argument(spill_dir):
    for bad in (raising(TypeError, "__fspath__"), raising(ValueError, "__getattr__")):
        with pytest.raises(spillarena.InvalidArgumentError, match="directory"):
            spillarena.make_per_file_stash(bad)


@pytest.mark.parametrize("error", NOT_OURS, ids=lambda e: e.__name__)
def test_what_a_length_raises_comes_out_as_itself(error):
    class Shape:
        def __getitem__(self, i):
            return 1

        def __len__(self):
            raise error("raised by the argument itself")

    with pytest.raises(error, match="raised by the argument itself"):
        spillarena.bytes_for_layer_inputs(2, Shape(), torch.float32)


def test_a_length_that_raises_a_type_error_is_a_bad_shape():
    class Shape:
        def __getitem__(self, i):
            return 1

        def __len__(self):
            raise TypeError("no length")

    with pytest.raises(spillarena.InvalidArgumentError, match="a \\(batch, seq, hidden\\) tuple"):
        spillarena.bytes_for_layer_inputs(2, Shape(), torch.float32)


@pytest.mark.parametrize("error", NOT_OURS, ids=lambda e: e.__name__)
def test_what_the_repr_of_a_refused_value_raises_comes_out_as_itself(error, spill_dir):
    # an object that is no integer is refused with its repr in the message: the repr's own
    # KeyboardInterrupt must not become that refusal
    with pytest.raises(error, match="raised by the argument itself"):
        spillarena.SpillArena(raising(error, "__repr__"), spill_dir)


def test_a_repr_that_raises_a_value_error_leaves_a_message(spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError, match="<unprintable object>"):
        spillarena.SpillArena(raising(ValueError, "__repr__"), spill_dir)


# ---------------------------------------------------------------------------------------------
# One numeric conversion for every option
# ---------------------------------------------------------------------------------------------

def _numbers():
    np = pytest.importorskip("numpy")
    return [2, 2.0, np.int64(2), np.int32(2), np.uint8(2), np.float64(2.0), np.float32(2.0),
            torch.tensor(2), torch.tensor(2.0), fractions.Fraction(4, 2)]


def test_a_number_option_takes_every_real_number_python_and_numpy_spell(spill_dir):
    for value in _numbers():
        arena = spillarena.SpillArena(1 << 20, spill_dir, growth_margin=value)
        assert arena.options()["growth_margin"] == 2.0, repr(value)
        automatic = spillarena.AutomaticArena(spill_dir, growth_margin=value)
        assert automatic.options["growth_margin"] is value
        del arena, automatic


def test_a_number_option_refuses_what_is_no_finite_number(spill_dir):
    np = pytest.importorskip("numpy")
    for bad, expected in [("2", "a number"), (True, "a number"), (np.True_, "a number"),
                          (torch.tensor(True), "a number"), (None, "a number"),
                          (np.complex128(1.5 + 3j), "a number"), (2 + 0j, "a number"),
                          (torch.tensor(2 + 3j), "a number"), (torch.tensor([[2.0]]), "a number"),
                          (b"2", "a number"), (float("nan"), "a finite number"),
                          (math.inf, "a finite number"), (np.float64("nan"), "a finite number"),
                          (10 ** 400, "a finite number"), (torch.tensor([2.0, 3.0]), "a number")]:
        with pytest.raises(spillarena.InvalidArgumentError,
                           match=f"growth_margin must be {expected}"):
            spillarena.SpillArena(1 << 20, spill_dir, growth_margin=bad)


def test_integer_options_take_numpy_integers_everywhere(spill_dir):
    np = pytest.importorskip("numpy")
    arena = spillarena.SpillArena(np.int64(1 << 20), spill_dir, keep_last=np.int32(1))
    assert arena.options()["keep_last"] == 1
    assert spillarena.AutomaticArena(spill_dir, layers=np.int64(3)).layers == 3
    assert spillarena.bytes_for_layer_inputs(np.int64(2), (np.int32(1), 2, 3), 4) == \
        spillarena.bytes_for_layer_inputs(2, (1, 2, 3), 4)
    for bad in (np.float64(3.0), True, np.True_, torch.tensor(True), torch.tensor([[3]]), 0, -1):
        with pytest.raises(spillarena.InvalidArgumentError, match="layers must be an integer"):
            spillarena.AutomaticArena(spill_dir, layers=bad)
    for bad in (np.True_, torch.tensor(True), torch.tensor([[3]])):
        with pytest.raises(spillarena.InvalidArgumentError, match="keep_last must be"):
            spillarena.SpillArena(1 << 20, spill_dir, keep_last=bad)
    with pytest.raises(spillarena.InvalidArgumentError, match="at most 4294967295"):
        spillarena.SpillArena(1 << 20, spill_dir, keep_last=1 << 32)
    del arena


@pytest.mark.parametrize("error", BAD_ARGUMENT, ids=lambda e: e.__name__)
def test_a_dtype_that_cannot_say_what_it_is_is_a_bad_argument(error, spill_dir):
    class Odd:
        def __index__(self):
            return 2

        def __float__(self):
            return 2.0

        @property
        def dtype(self):
            raise error("no dtype here")

    for call in (lambda: spillarena.SpillArena(1 << 20, spill_dir, keep_last=Odd()),
                 lambda: spillarena.SpillArena(1 << 20, spill_dir, growth_margin=Odd())):
        with pytest.raises(spillarena.InvalidArgumentError, match="must be"):
            call()
    with pytest.raises(spillarena.InvalidArgumentError, match="layers must be an integer"):
        spillarena.AutomaticArena(spill_dir, layers=Odd())
