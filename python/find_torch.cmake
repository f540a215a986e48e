# Included before project() when scikit-build-core builds the package (CMAKE_PROJECT_INCLUDE_BEFORE
# in pyproject.toml). Points CMake at the torch of the Python running the build before anything
# else (cmake/FindTorchFromVenv.cmake looks for a .venv in the source tree) can pick another one.
# See Note [Build against the installed torch] in python/CMakeLists.txt (located, not imported).
if(NOT Torch_DIR AND Python_EXECUTABLE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u, os; print(os.path.join(u.find_spec('torch').submodule_search_locations[0], 'share', 'cmake'))"
    OUTPUT_VARIABLE _spill_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _spill_rc ERROR_VARIABLE _spill_err)
  if(NOT _spill_rc EQUAL 0)
    message(FATAL_ERROR "spillarena: ${Python_EXECUTABLE} has no torch. Install torch "
      "first, then build with `pip install --no-build-isolation .`\n${_spill_err}")
  endif()
  set(Torch_DIR "${_spill_prefix}/Torch" CACHE PATH "LibTorch of the building Python")
  set(Caffe2_DIR "${_spill_prefix}/Caffe2" CACHE PATH "LibTorch of the building Python")
  message(STATUS "spillarena: LibTorch of ${Python_EXECUTABLE}: ${_spill_prefix}")
endif()
