# Runs a command that must fail: a non-zero exit and output (stdout or stderr) matching EXPECT.
# Run with cmake -P: -DEXPECT=<regex> -DCOMMAND=<program;arg;...>
if(NOT DEFINED COMMAND OR NOT DEFINED EXPECT)
  message(FATAL_ERROR "CarveExpectFailure.cmake needs -DCOMMAND=... and -DEXPECT=...")
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a failure, but the command succeeded:\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the command failed (${rc}) without saying '${EXPECT}':\n${out}${err}")
endif()
