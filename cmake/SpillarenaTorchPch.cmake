# Note [One precompiled LibTorch header]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Every LibTorch translation unit parses <torch/torch.h> first: some 35 s of the 36 s one such
# unit takes on the 2-core CI machine, and the main build has 36 of them (the ASan tree 18 more).
# So <torch/torch.h> is precompiled once per build tree, by the library `spillarena`, and every
# other LibTorch target of the project reuses that file (REUSE_FROM): 16 s a unit instead of 36.
#
# GCC accepts a precompiled header only where the code-generation flags match: the library is
# built -fPIC, executables -fPIE, and a -fPIE unit refuses a -fPIC header ("created and used with
# different settings of -fpie"). So the executables that reuse it are compiled -fPIC too (given
# after CMake's -fPIE, it wins; -fPIC code links into a PIE executable). CMake adds
# -Winvalid-pch, so a header refused for another reason is a warning (an error under -Werror),
# never a silent slow build; without -Werror GCC then reads <torch/torch.h> as text.
#
# Sources that do not include LibTorch are left out (SKIP_PRECOMPILE_HEADERS): forced into them,
# the header would make a 2 s unit a 16 s one. The header examples (tests/header_examples/)
# never get it: they prove each public header compiles alone.
#
# SPILLARENA_PRECOMPILE_TORCH=OFF turns it off (a compiler or ccache setup that objects). The
# header is PRIVATE to each target: nothing of it reaches an installed consumer.
option(SPILLARENA_PRECOMPILE_TORCH "Precompile <torch/torch.h> once for spillarena's targets" ON)

# The library that owns the precompiled header.
function(spillarena_precompile_torch target)
  if(SPILLARENA_PRECOMPILE_TORCH)
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  endif()
endfunction()

# `target` reuses the library's header; `ARGN` are its sources that do not include LibTorch.
function(spillarena_reuse_torch_pch target)
  if(NOT SPILLARENA_PRECOMPILE_TORCH OR NOT TARGET spillarena)
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM spillarena)
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  if(ARGN)
    set_source_files_properties(${ARGN} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
