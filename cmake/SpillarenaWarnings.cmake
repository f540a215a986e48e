# Warnings for spillarena's own targets; LibTorch's headers come in as system headers. Warnings
# are errors only when spillarena is the top-level project: a consumer's add_subdirectory with
# another compiler must not break on a new warning.
function(spillarena_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(SPILLARENA_WERROR AND CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
