// spillarena._C: the C++ half of the Python package. It links no torch (Note [One wheel for every
// torch] in python/CMakeLists.txt); spillarena/__init__.py checks the torch version first.
#include <pybind11/pybind11.h>

#include "binding.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "spillarena C++ core: the arena, its stash and the error types";
  spillarena_python::bind_errors(m);
  spillarena_python::bind_arena(m);
  spillarena_python::bind_stash(m);
  spillarena_python::bind_per_file(m);
}
