# Compiles CUDA sources for each architecture with `ptxas -v` and fails if any kernel spills
# registers to local memory. Run with cmake -P:
#   -DNVCC=<nvcc> -DINCLUDE="<include dirs>" -DARCHS="80;90" -DSOURCES="a.cu;b.cu"
foreach(var NVCC INCLUDE ARCHS SOURCES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "CarveCheckSpills.cmake needs -D${var}=...")
  endif()
endforeach()

set(include_flags)
foreach(dir IN LISTS INCLUDE)
  list(APPEND include_flags -I${dir})
endforeach()

set(spilling)
foreach(source IN LISTS SOURCES)
  foreach(arch IN LISTS ARCHS)
    execute_process(
      COMMAND ${NVCC} -std=c++20 -cubin -arch=sm_${arch} -Xptxas -v ${include_flags} ${source} -o /dev/null
      RESULT_VARIABLE rc
      ERROR_VARIABLE report
      OUTPUT_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "nvcc failed on ${source} for sm_${arch}:\n${report}")
    endif()
    # ptxas prints "Compiling entry function '<name>'" and, a line or two later, the spill counts.
    string(REPLACE "\n" ";" lines "${report}")
    set(kernel "")
    set(kernels 0)
    foreach(line IN LISTS lines)
      if(line MATCHES "Compiling entry function '([^']+)'")
        set(kernel "${CMAKE_MATCH_1}")
        math(EXPR kernels "${kernels} + 1")
      elseif(line MATCHES "([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads")
        if(NOT CMAKE_MATCH_1 EQUAL 0 OR NOT CMAKE_MATCH_2 EQUAL 0)
          list(APPEND spilling "sm_${arch} ${kernel}: ${CMAKE_MATCH_0}")
        endif()
      endif()
    endforeach()
    get_filename_component(name ${source} NAME)
    message(STATUS "${name} sm_${arch}: ${kernels} kernels checked")
  endforeach()
endforeach()

if(spilling)
  list(JOIN spilling "\n  " text)
  message(FATAL_ERROR "kernels that spill registers:\n  ${text}")
endif()
