# Helpers shared by every troupe folder.

# Warnings are errors on troupe's own code (not on dependencies). GCC 12 reports false -Wrestrict
# positives inside std::string concatenation at -O3 (GCC bug 105329), so that one warning is off.
function(troupe_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-missing-field-initializers
    $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>>)
endfunction()

# troupe_library(NAME SOURCES ... LINKS ...): one static library per folder, its headers included as
# "engine/core/dtype.hpp" from the repository root.
function(troupe_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINKS;PRIVATE_LINKS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_LINKS} PRIVATE ${ARG_PRIVATE_LINKS})
  troupe_warnings(${name})
endfunction()

# troupe_test(NAME SOURCES ... LINKS ... [LABELS ...] [FIXTURES ...]): a GoogleTest executable whose
# tests ctest discovers. FIXTURES names ctest fixtures the tests need (e.g. `references`, the pinned
# npm reference packages installed by scripts/install-references).
function(troupe_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINKS;LABELS;FIXTURES" ${ARGN})
  # Every test binary removes the scratch directories its process made (tests/support/scratch_cleanup.cpp).
  add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/support/scratch_cleanup.cpp)
  target_link_libraries(${name} PRIVATE ${ARG_LINKS} GTest::gtest_main GTest::gmock)
  troupe_warnings(${name})
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  if(ARG_FIXTURES)
    gtest_discover_tests(${name} PROPERTIES LABELS "${labels}" FIXTURES_REQUIRED "${ARG_FIXTURES}"
                         DISCOVERY_TIMEOUT 60 WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  else()
    gtest_discover_tests(${name} PROPERTIES LABELS "${labels}" DISCOVERY_TIMEOUT 60
                         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  endif()
endfunction()
