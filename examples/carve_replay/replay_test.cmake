# Runs carve_replay on a trace and checks its output: every regex in EXPECT must match, none in
# FORBID may. A trace that is absent (the shared real snapshot beside the repository) makes the
# test print "skipped: <trace> is absent", which ctest reports as skipped.
# cmake -DREPLAY=<carve_replay> -DTRACE=<file> -DARGS=<a;b> -DEXPECT=<re;re> [-DFORBID=<re;re>] -P replay_test.cmake
if(NOT EXISTS "${TRACE}")
  message("skipped: ${TRACE} is absent")
  return()
endif()
execute_process(COMMAND ${REPLAY} ${TRACE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "carve_replay failed (${rc})")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT "${out}" MATCHES "${re}")
    message(FATAL_ERROR "the output does not say '${re}'")
  endif()
endforeach()
foreach(re IN LISTS FORBID)
  if("${out}" MATCHES "${re}")
    message(FATAL_ERROR "the output says '${re}'")
  endif()
endforeach()
