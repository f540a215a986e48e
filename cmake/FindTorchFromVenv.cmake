# When no Torch_DIR / CMAKE_PREFIX_PATH names LibTorch, ask the project's virtual environment
# (.venv, made by scripts/setup.sh) or $SPILLARENA_PYTHON where its torch keeps the CMake config.
if(NOT Torch_DIR)
  set(_spill_python "$ENV{SPILLARENA_PYTHON}")
  if(NOT _spill_python AND EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python")
    set(_spill_python "${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python")
  endif()
  if(_spill_python)
    execute_process(
      COMMAND "${_spill_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _spill_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _spill_rc)
    if(_spill_rc EQUAL 0 AND _spill_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH "${_spill_torch_prefix}")
      message(STATUS "spillarena: LibTorch from ${_spill_python}: ${_spill_torch_prefix}")
    endif()
  endif()
endif()
