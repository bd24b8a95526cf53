# carve_find_cccl(): find CCCL's libcu++ (the only dependency of carve's headers).
#
# CCCL ships with the CUDA Toolkit, whose CMake package files live in <toolkit>/lib/cmake, or in
# <toolkit>/targets/<arch>-linux/lib/cmake where the toolkit came as distribution packages.
# The toolkit is searched where nvcc is, then CUDA_PATH / CUDA_HOME, then /usr/local/cuda;
# set CCCL_DIR to use another copy (e.g. a CCCL checkout without a toolkit).
macro(carve_find_cccl)
  set(_carve_cccl_hints)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_carve_nvcc_dir "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    list(APPEND _carve_cccl_hints "${_carve_nvcc_dir}/../lib/cmake")
  endif()
  foreach(_carve_env CUDA_PATH CUDA_HOME)
    if(DEFINED ENV{${_carve_env}})
      list(APPEND _carve_cccl_hints "$ENV{${_carve_env}}/lib/cmake")
    endif()
  endforeach()
  list(APPEND _carve_cccl_hints /usr/local/cuda/lib/cmake)
  foreach(_carve_hint IN LISTS _carve_cccl_hints)
    list(APPEND _carve_cccl_hints "${_carve_hint}/../../targets/${CMAKE_SYSTEM_PROCESSOR}-linux/lib/cmake")
  endforeach()
  find_package(CCCL CONFIG REQUIRED COMPONENTS libcudacxx HINTS ${_carve_cccl_hints})
  # Include CCCL as system headers, so that consumers' warning flags apply to their code only.
  if(TARGET _libcudacxx_libcudacxx)
    get_target_property(_carve_cccl_imported _libcudacxx_libcudacxx IMPORTED)
    if(NOT _carve_cccl_imported)
      set_target_properties(_libcudacxx_libcudacxx PROPERTIES SYSTEM ON)
    endif()
  endif()
endmacro()
