# carve_embedding_lookup: the embedding-lookup system of examples/embedding_lookup (headers),
# shared by the example, its test and the latency benchmark. io_uring is used when liburing is
# found (EMBEDDING_HAVE_LIBURING); without it the loaders read with pread.
add_library(carve_embedding_lookup INTERFACE)
target_include_directories(carve_embedding_lookup INTERFACE ${PROJECT_SOURCE_DIR}/examples/embedding_lookup)
find_package(Threads REQUIRED)
target_link_libraries(carve_embedding_lookup INTERFACE carve::carve Threads::Threads)
find_library(CARVE_URING_LIBRARY uring)
find_path(CARVE_URING_INCLUDE_DIR liburing.h)
if(CARVE_URING_LIBRARY AND CARVE_URING_INCLUDE_DIR)
  target_compile_definitions(carve_embedding_lookup INTERFACE EMBEDDING_HAVE_LIBURING)
  target_include_directories(carve_embedding_lookup SYSTEM INTERFACE ${CARVE_URING_INCLUDE_DIR})
  target_link_libraries(carve_embedding_lookup INTERFACE ${CARVE_URING_LIBRARY})
endif()
