# rocm_sd_detect_torch_gpu(<out_var>): hip, cuda or none, from the torch the package is installed
# beside.
#
# pip builds in an isolated environment without torch, on purpose (so that pip never pulls a
# CUDA torch in as a build requirement). The interpreter is still the user's one, so it is asked
# in isolated mode (-I: ignore PYTHONPATH and the build environment's sitecustomize), which sees
# the user's site-packages and their torch.
function(rocm_sd_detect_torch_gpu out_var)
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -I -c
            "import torch; print('hip' if torch.version.hip else 'cuda' if torch.version.cuda else 'none')"
    OUTPUT_VARIABLE detected
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE rc
    ERROR_QUIET)
  if(NOT rc EQUAL 0 OR detected STREQUAL "")
    message(STATUS "rocm_sd: no torch found next to ${Python_EXECUTABLE}; building without kernels")
    set(detected "none")
  else()
    message(STATUS "rocm_sd: the installed torch is a '${detected}' build")
  endif()
  set(${out_var} "${detected}" PARENT_SCOPE)
endfunction()
