# carve_warnings(<target>): the warning flags carve's own tests, benchmarks and examples build with.
function(carve_warnings target)
  set(common -Wall -Wextra -Wshadow -Wconversion -Wsign-conversion)
  set(cxx_flags ${common} -Wpedantic)
  if(CARVE_WERROR)
    list(APPEND cxx_flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${cxx_flags}>)
  if(CARVE_ENABLE_CUDA)
    # No -Wpedantic for nvcc's host pass: the code nvcc generates uses GNU line directives.
    list(JOIN common "," host_flags)
    set(cuda_flags -Xcompiler=${host_flags})
    if(CARVE_WERROR)
      list(APPEND cuda_flags -Werror=all-warnings -Xcompiler=-Werror)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${cuda_flags}>)
  endif()
endfunction()

# carve_no_spill_test(<name> <.cu sources>...): a ctest test that compiles the sources for every
# CUDA architecture with `ptxas -v` and fails if a kernel spills registers to local memory.
function(carve_no_spill_test name)
  if(NOT (CARVE_ENABLE_CUDA AND CARVE_BUILD_TESTS))
    return()
  endif()
  set(sources)
  foreach(source IN LISTS ARGN)
    list(APPEND sources ${CMAKE_CURRENT_SOURCE_DIR}/${source})
  endforeach()
  add_test(NAME ${name}_no_register_spills
    COMMAND ${CMAKE_COMMAND} -DNVCC=${CMAKE_CUDA_COMPILER} -DINCLUDE=${PROJECT_SOURCE_DIR}/include
      "-DARCHS=${CMAKE_CUDA_ARCHITECTURES}" "-DSOURCES=${sources}" -P ${PROJECT_SOURCE_DIR}/cmake/CarveCheckSpills.cmake)
  set_tests_properties(${name}_no_register_spills PROPERTIES LABELS cuda)
endfunction()

# carve_expect_failure(<name> EXPECT <regex> COMMAND <program> <args>...): a test that passes
# when the command exits non-zero and its output matches the regex (a clear error message).
function(carve_expect_failure name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "EXPECT" "COMMAND")
  list(POP_FRONT arg_COMMAND program)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} "-DEXPECT=${arg_EXPECT}" "-DCOMMAND=$<TARGET_FILE:${program}>;${arg_COMMAND}"
      -P ${PROJECT_SOURCE_DIR}/cmake/CarveExpectFailure.cmake)
endfunction()
