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
    # ptxas reports every kernel that spills registers to local memory, for every architecture
    # built; with CARVE_WERROR a spill fails the build like any other warning.
    list(JOIN common "," host_flags)
    set(cuda_flags -Xcompiler=${host_flags} -Xptxas=-warn-spills)
    if(CARVE_WERROR)
      list(APPEND cuda_flags -Werror=all-warnings -Xcompiler=-Werror -Xptxas=-Werror)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${cuda_flags}>)
    carve_frame_limit(${target} ${CARVE_KERNEL_FRAME_LIMIT})
  endif()
endfunction()

# The most stack a kernel may use (its frame plus the frames of what it calls), checked on every
# kernel of every architecture when carve_warnings is applied. 256 bytes: room for a search
# snapshot (LazySnapshot keeps at most 16 words, 192 bytes with its tags) and a kernel's own few
# locals, and well short of a bitmap copy (a 4096-slot bitmap alone is 512 bytes).
set(CARVE_KERNEL_FRAME_LIMIT 256 CACHE STRING "Largest stack frame (bytes) a carve kernel may have")

# carve_frame_limit(<target> <bytes>): checks every kernel the target's .cu files define against
# <bytes> of stack (cmake/CarveFrameCheck.cmake, run as the CUDA compiler launcher, reads ptxas's
# resource report); with CARVE_WERROR a kernel above it fails the build, otherwise it is a warning.
# carve_warnings applies CARVE_KERNEL_FRAME_LIMIT; call this after it to state a target's own.
function(carve_frame_limit target bytes)
  set(fatal OFF)
  if(CARVE_WERROR)
    set(fatal ON)
  endif()
  # A launcher the user configured (ccache, say) still runs: after the check, before nvcc.
  set(launcher ${CMAKE_COMMAND} -DCARVE_FRAME_LIMIT=${bytes} -DCARVE_FRAME_FATAL=${fatal} -P
    ${PROJECT_SOURCE_DIR}/cmake/CarveFrameCheck.cmake -- ${CMAKE_CUDA_COMPILER_LAUNCHER})
  set_target_properties(${target} PROPERTIES CUDA_COMPILER_LAUNCHER "${launcher}")
endfunction()

# carve_expect_failure(<name> EXPECT <regex> [EXIT_CODE <n>] COMMAND <program> <args>...): a test
# that passes when the command exits non-zero (with status <n>, when given) and its output matches
# the regex (a clear error message).
function(carve_expect_failure name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "EXPECT;EXIT_CODE" "COMMAND")
  list(POP_FRONT arg_COMMAND program)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} "-DEXPECT=${arg_EXPECT}" "-DEXIT_CODE=${arg_EXIT_CODE}"
      "-DCOMMAND=$<TARGET_FILE:${program}>;${arg_COMMAND}" -P ${PROJECT_SOURCE_DIR}/cmake/CarveExpectFailure.cmake)
endfunction()

# carve_compile_check(<name> SOURCE <file> [DEFINES <macro>...] [EXPECT <regex>]): a test that
# compiles the source against carve (-fsyntax-only) and passes when it compiles, or, with
# EXPECT, when it fails with a message matching the regex: how concepts and static_asserts
# that refuse a combination are tested.
function(carve_compile_check name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "SOURCE;EXPECT" "DEFINES")
  set(flags "-I${PROJECT_SOURCE_DIR}/include")
  foreach(define IN LISTS arg_DEFINES)
    list(APPEND flags "-D${define}")
  endforeach()
  set(expect)
  if(DEFINED arg_EXPECT)
    set(expect "-DEXPECT=${arg_EXPECT}")
  endif()
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/${arg_SOURCE}"
      "-DFLAGS=${flags}" "-DINCLUDES=$<TARGET_PROPERTY:libcudacxx::libcudacxx,INTERFACE_INCLUDE_DIRECTORIES>"
      ${expect} -P ${PROJECT_SOURCE_DIR}/cmake/CarveCompileCheck.cmake)
endfunction()
