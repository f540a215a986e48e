// spillarena._C: the C++ half of the Python package. The Python half (spillarena/__init__.py)
// checks the torch version before importing it; see Note [Build against the installed torch] in
// python/CMakeLists.txt.
#include <torch/extension.h>

#include "binding.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "spillarena C++ core: the arena, its stash and the error types";
  m.attr("__torch_version__") = SPILLARENA_TORCH_VERSION;
  spillarena_python::bind_errors(m);
  spillarena_python::bind_arena(m);
  spillarena_python::bind_stash(m);
  spillarena_python::bind_replay(m);
}
