# carve_service_programs(): carve-served (examples/carve_served.cpp) and the example client
# (examples/service_client.cpp). Tests and benchmarks start them as real processes, so whichever
# of tests/, benchmarks/ and examples/ asks first defines them; they land in <build>/examples.
# With CARVE_ENABLE_CUDA, carve-served links the CUDA runtime and can serve real GPUs
# (--backend cuda).
function(carve_service_programs)
  if(TARGET carve-served)
    return()
  endif()
  add_executable(carve-served ${PROJECT_SOURCE_DIR}/examples/carve_served.cpp)
  add_executable(service_client ${PROJECT_SOURCE_DIR}/examples/service_client.cpp)
  foreach(program carve-served service_client)
    target_link_libraries(${program} PRIVATE carve::carve)
    carve_warnings(${program})
    set_target_properties(${program} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/examples)
  endforeach()
  if(CARVE_ENABLE_CUDA)
    find_package(CUDAToolkit REQUIRED)
    target_link_libraries(carve-served PRIVATE CUDA::cudart_static)
    if(TARGET carve::nvml)
      target_link_libraries(carve-served PRIVATE carve::nvml) # --topology cuda counts NVLinks
    endif()
  endif()
endfunction()
