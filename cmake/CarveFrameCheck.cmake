# The stack-frame check on every kernel carve builds, run as the CUDA compiler launcher (see
# carve_warnings in CarveWarnings.cmake):
#
#   cmake -DCARVE_FRAME_LIMIT=<bytes> [-DCARVE_FRAME_FATAL=ON] -P CarveFrameCheck.cmake -- <nvcc command>
#
# runs the nvcc command with ptxas's resource report (-Xptxas=-v) and reads, for every entry
# function and every architecture, the "bytes cumulative stack size" ptxas states: the kernel's own
# frame plus the deepest chain of frames of the functions it calls. A kernel above the limit is
# reported by name; with CARVE_FRAME_FATAL the compile then fails, like a spill under -Werror.
#
# Why frames and not only spills: -warn-spills sees registers that overflow, not arrays a kernel
# keeps in local memory by design. A per-thread copy of a bitmap (a search snapshot, say) costs
# N / 8 bytes of local memory per thread and per call site, which is latency on every access and
# memory the launch has to reserve for every resident thread; it never shows as a spill.
#
# Everything else nvcc prints is passed through unchanged; the resource report itself is not.
if(NOT DEFINED CARVE_FRAME_LIMIT)
  message(FATAL_ERROR "CarveFrameCheck.cmake: set CARVE_FRAME_LIMIT (bytes)")
endif()

set(command)
set(after_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_separator)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "CarveFrameCheck.cmake: no command after --")
endif()

execute_process(COMMAND ${command} -Xptxas=-v RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)

set(over "")
set(entry "")
set(arch "")
# Split into lines for reading only: a line of source quoted in a diagnostic may hold a ';', but
# none of ptxas's report lines does.
string(REPLACE "\n" ";" lines "${err}")
foreach(line IN LISTS lines)
  if(line MATCHES "^ptxas info +: Compiling entry function '([^']+)' for '([^']+)'")
    set(entry "${CMAKE_MATCH_1}")
    set(arch "${CMAKE_MATCH_2}")
  elseif(line MATCHES "^ptxas info +: Used .* ([0-9]+) bytes cumulative stack size")
    if(CMAKE_MATCH_1 GREATER CARVE_FRAME_LIMIT)
      string(APPEND over "  ${entry} (${arch}): ${CMAKE_MATCH_1} bytes\n")
    endif()
  endif()
endforeach()
# The diagnostics as nvcc wrote them, without the report.
string(REGEX REPLACE "ptxas info +:[^\n]*\n?" "" passed "${err}")
string(REGEX REPLACE "  +[0-9]+ bytes stack frame, [0-9]+ bytes spill[^\n]*\n?" "" passed "${passed}")

if(NOT out STREQUAL "")
  execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${out}")
endif()
if(NOT passed STREQUAL "")
  message(NOTICE "${passed}")
endif()
if(NOT result EQUAL 0)
  # nvcc failed: its own messages (passed on above) say why.
  message(FATAL_ERROR "")
endif()
if(NOT over STREQUAL "")
  if(CARVE_FRAME_FATAL)
    message(FATAL_ERROR "error: kernel stack frames above the ${CARVE_FRAME_LIMIT}-byte limit "
                        "(CARVE_FRAME_LIMIT; local arrays such as a bitmap copy live there):\n${over}")
  endif()
  message(WARNING "kernel stack frames above the ${CARVE_FRAME_LIMIT}-byte limit:\n${over}")
endif()
