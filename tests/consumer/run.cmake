# Builds and runs tests/consumer twice: once pulling carve in with FetchContent, once against
# an installed carve found with find_package. Run with cmake -P.
foreach(var CARVE_SOURCE_DIR WORK_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

set(consumer_src ${CMAKE_CURRENT_LIST_DIR})
set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release)

# 1. FetchContent straight from the source tree.
run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/fetch ${common}
    -DCARVE_MODE=fetch -DCARVE_SOURCE_DIR=${CARVE_SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/fetch)
run(${WORK_DIR}/fetch/consumer)
if(EXISTS ${WORK_DIR}/fetch/consumer_numa)
  run(${WORK_DIR}/fetch/consumer_numa)
endif()

# 2. Install carve into a prefix, then find_package it.
run(${CMAKE_COMMAND} -S ${CARVE_SOURCE_DIR} -B ${WORK_DIR}/carve ${common} -DCARVE_ENABLE_CUDA=OFF
    -DCARVE_BUILD_TESTS=OFF -DCARVE_BUILD_BENCHMARKS=OFF -DCARVE_BUILD_EXAMPLES=OFF
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/carve)
run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/package ${common}
    -DCARVE_MODE=package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/package)
run(${WORK_DIR}/package/consumer)
if(EXISTS ${WORK_DIR}/fetch/consumer_numa) # libnuma is here: the installed package must offer carve::numa too
  run(${WORK_DIR}/package/consumer_numa)
endif()
