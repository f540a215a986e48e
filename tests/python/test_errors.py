"""The Python error classes come from one table in the extension and match include/spill/error.h."""

import pathlib
import pickle
import re

import pytest

import spillarena
from spillarena import errors

ERROR_H = pathlib.Path(__file__).resolve().parents[2] / "include" / "spill" / "error.h"


def cpp_error_classes():
    """{name: base} for every class declared in include/spill/error.h."""
    text = ERROR_H.read_text()
    declared = re.findall(r"^class (\w+)(?: final)? : public ([\w:]+) \{", text, re.M)
    assert declared, f"no class found in {ERROR_H}"
    return {name: base.removeprefix("std::") for name, base in declared}


def test_every_cpp_error_type_has_its_python_class_with_the_same_base():
    bases = {"runtime_error": RuntimeError}
    for name, base in cpp_error_classes().items():
        cls = getattr(errors, name)
        assert cls.__module__ == "spillarena.errors"
        assert cls.__bases__[0] is bases.get(base) or cls.__bases__[0].__name__ == base, name
        assert cls.__doc__, name
    assert set(errors.__all__) == set(cpp_error_classes()) | {"SpillArenaWarning"}


def test_the_sizing_warning_is_a_user_warning_of_its_own():
    assert issubclass(spillarena.SpillArenaWarning, UserWarning)
    assert spillarena.SpillArenaWarning.__module__ == "spillarena.errors"


def test_the_builtin_mixins():
    assert issubclass(spillarena.InvalidArgumentError, ValueError)
    assert issubclass(spillarena.Error, RuntimeError)
    assert not hasattr(spillarena, "RamBackedDirectoryError")  # no alias in 0.1.0


@pytest.mark.parametrize("name", sorted(cpp_error_classes()))
def test_errors_pickle_with_their_class_and_message(name):
    with pytest.raises(getattr(errors, name)) as caught:
        spillarena._C._throw(name, f"spill: {name} pickled")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert type(copy) is type(caught.value) and str(copy) == f"spill: {name} pickled"


def test_an_unknown_example_name_is_refused():
    with pytest.raises(spillarena.InvalidArgumentError, match="no error class 'Nope'"):
        spillarena._C._throw("Nope", "m")
