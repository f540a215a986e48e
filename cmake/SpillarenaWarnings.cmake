# Warnings for spillarena's own targets; LibTorch's headers come in as system headers.
function(spillarena_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(SPILLARENA_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
