# Builds and runs tests/consumer one way, MODE: `fetch` pulls carve in with FetchContent,
# `package` installs carve and finds it with find_package (two tests, so each stays short). Run
# with cmake -P. Where nvcc is found ($CUDACXX,
# PATH, $CUDA_HOME/bin, /usr/local/cuda/bin), both are CUDA projects too and build a kernel that
# uses carve; otherwise the CUDA consumers are skipped with a message saying so.
foreach(var CARVE_SOURCE_DIR WORK_DIR CXX_COMPILER GENERATOR MODE)
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

# run_expect_failure(<regex> <command>...): the command must fail and print <regex>.
function(run_expect_failure expect)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE ";" " " cmd "${ARGN}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a failure, but this succeeded: ${cmd}")
  endif()
  if(NOT "${out}${err}" MATCHES "${expect}")
    message(FATAL_ERROR "failed (${rc}) without saying '${expect}': ${cmd}\n${out}${err}")
  endif()
endfunction()

set(nvcc "$ENV{CUDACXX}")
if(NOT nvcc)
  set(hints)
  if(DEFINED ENV{CUDA_HOME})
    list(APPEND hints "$ENV{CUDA_HOME}/bin")
  endif()
  find_program(CONSUMER_NVCC nvcc HINTS ${hints} PATHS /usr/local/cuda/bin)
  if(CONSUMER_NVCC)
    set(nvcc ${CONSUMER_NVCC})
  endif()
endif()
set(cuda -DCONSUMER_CUDA=OFF)
if(nvcc)
  message(STATUS "consumer: CUDA consumers with ${nvcc}")
  set(cuda -DCONSUMER_CUDA=ON -DCMAKE_CUDA_COMPILER=${nvcc} -DCMAKE_CUDA_ARCHITECTURES=80)
else()
  message(STATUS "consumer: no nvcc ($CUDACXX, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): CUDA consumers skipped")
endif()

set(consumer_src ${CMAKE_CURRENT_LIST_DIR})
set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release ${cuda})
set(below_cxx20 "carve needs C\\+\\+20: link carve::carve, or pass -std=c\\+\\+20")

if(MODE STREQUAL "fetch") # FetchContent straight from the source tree
run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/fetch ${common}
    -DCARVE_MODE=fetch -DCARVE_SOURCE_DIR=${CARVE_SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/fetch)
run(${WORK_DIR}/fetch/consumer)
if(EXISTS ${WORK_DIR}/fetch/consumer_numa)
  run(${WORK_DIR}/fetch/consumer_numa)
endif()
run_expect_failure("${below_cxx20}" ${CMAKE_COMMAND} --build ${WORK_DIR}/fetch --target consumer_below_cxx20)
if(nvcc)
  run(${WORK_DIR}/fetch/consumer_cuda)
  run_expect_failure("${below_cxx20}" ${CMAKE_COMMAND} --build ${WORK_DIR}/fetch --target consumer_cuda_below_cxx20)
endif()
return()
endif()
if(NOT MODE STREQUAL "package")
  message(FATAL_ERROR "run.cmake: MODE is fetch or package, not '${MODE}'")
endif()

# Install carve into a prefix, then find_package it. This consumer sets CMAKE_CUDA_STANDARD 20
# itself, as many projects do: that must give -std=c++20 too, with CUDA extensions on (the default).
run(${CMAKE_COMMAND} -S ${CARVE_SOURCE_DIR} -B ${WORK_DIR}/carve -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_BUILD_TYPE=Release -DCARVE_ENABLE_CUDA=OFF
    -DCARVE_BUILD_TESTS=OFF -DCARVE_BUILD_BENCHMARKS=OFF -DCARVE_BUILD_EXAMPLES=OFF
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/carve)
run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/package ${common}
    -DCARVE_MODE=package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_CUDA_STANDARD=20)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/package)
run(${WORK_DIR}/package/consumer)
if(nvcc)
  run(${WORK_DIR}/package/consumer_cuda)
endif()
find_file(CONSUMER_NUMA_H numa.h) # libnuma is here: the installed package must offer carve::numa too
if(CONSUMER_NUMA_H)
  run(${WORK_DIR}/package/consumer_numa)
endif()
