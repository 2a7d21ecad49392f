# kvtier_target_options(TARGET): warnings and sanitizers for kvtier's own targets only.
function(kvtier_target_options target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 bug 105329: -Wrestrict false positives inside std::string at -O3.
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(KVTIER_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# Sanitizers apply to the whole build (a half-instrumented binary reports false races).
if(KVTIER_SANITIZE)
  string(REPLACE ";" "," _kvtier_san "${KVTIER_SANITIZE}")
  add_compile_options(-fsanitize=${_kvtier_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_kvtier_san})
endif()

# With fuzz targets, the library is instrumented for coverage too, so libFuzzer sees the parsers'
# branches and not only the harness's.
if(KVTIER_BUILD_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# kvtier_add_test(NAME SOURCES... [LIBS ...] [LABELS ...] [TIMEOUT s]): one gtest binary, one ctest entry.
function(kvtier_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  kvtier_target_options(${name})
  target_link_libraries(${name} PRIVATE kvtier kvtier_testing GTest::gtest GTest::gtest_main ${ARG_LIBS})
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "KVTIER_SHARED_DIR=${KVTIER_SHARED_DIR}")
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
