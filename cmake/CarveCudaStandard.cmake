# carve_require_cuda_cxx20(<target> [BUILD_INTERFACE]): make <target>'s consumers compile their
# .cu files as C++20, which carve's headers need (concepts, <=>, consteval) in nvcc's host and
# device passes alike. Used by carve's own build (BUILD_INTERFACE: only for targets in this build
# tree) and by the installed package (on the imported carve::carve), so the decision is taken by
# the CMake that builds the consumer.
#
# CMake 3.25.2 and later know nvcc 12's -std=c++20, so the cuda_std_20 compile feature does it and
# combines with whatever standard the consumer asks for. CMake 3.25.0 and 3.25.1 do not
# (CMake issue 23079): there the feature is refused outright, and CUDA_STANDARD 20 silently decays
# to C++17 unless CMAKE_CUDA20_STANDARD_COMPILE_OPTION is defined and CUDA_EXTENSIONS is OFF. For
# those versions, .cu files of consumers that set no CUDA_STANDARD get -std=c++20 directly, and the
# two missing flag variables are defined as cache entries, so that a consumer's CUDA_STANDARD 20
# gives -std=c++20 with or without extensions.
function(carve_require_cuda_cxx20 target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "BUILD_INTERFACE" "" "")
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.25.2)
    set(feature cuda_std_20)
    if(arg_BUILD_INTERFACE)
      set(feature "$<BUILD_INTERFACE:${feature}>")
    endif()
    set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_FEATURES "${feature}")
    return()
  endif()

  set(nvcc12 "$<AND:$<COMPILE_LANG_AND_ID:CUDA,NVIDIA>,$<VERSION_GREATER_EQUAL:$<CUDA_COMPILER_VERSION>,12.0>>")
  set(option "$<$<AND:${nvcc12},$<STREQUAL:$<TARGET_PROPERTY:CUDA_STANDARD>,>>:-std=c++20>")
  if(arg_BUILD_INTERFACE)
    set(option "$<BUILD_INTERFACE:${option}>")
  endif()
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_OPTIONS "${option}")

  if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    foreach(kind STANDARD EXTENSION)
      if(NOT DEFINED CMAKE_CUDA20_${kind}_COMPILE_OPTION)
        set(CMAKE_CUDA20_${kind}_COMPILE_OPTION "-std=c++20" CACHE STRING
          "nvcc's C++20 flag, which this CMake does not know (set by carve)")
        mark_as_advanced(CMAKE_CUDA20_${kind}_COMPILE_OPTION)
      endif()
    endforeach()
  endif()
endfunction()
