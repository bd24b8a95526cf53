// The translation unit that builds the tests' precompiled header (carve_test_pch in
// tests/CMakeLists.txt); it has nothing of its own.
