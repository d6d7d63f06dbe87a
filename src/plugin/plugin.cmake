# ferry_pjrt_plugin.so: a PJRT C API plugin that wraps another plugin and gives its callers (JAX,
# torch_xla) ferry's host transfers (src/plugin/wrapped_plugin.h, docs/jax.md). Included by the
# top-level CMakeLists.txt when the PJRT C API header was found (FERRY_HAVE_PJRT).
add_library(ferry_pjrt_plugin MODULE
  src/plugin/device_to_host.cc
  src/plugin/ferry_pjrt_plugin.cc
  src/plugin/host_to_device.cc
  src/plugin/plugin_errors.cc
  src/plugin/plugin_events.cc
  src/plugin/plugin_types.cc
  src/plugin/version_bridge.cc
  src/plugin/wrapped_plugin.cc
)
set_target_properties(ferry_pjrt_plugin PROPERTIES PREFIX "" OUTPUT_NAME ferry_pjrt_plugin
                      INSTALL_RPATH "$ORIGIN")
target_include_directories(ferry_pjrt_plugin PRIVATE ${PROJECT_SOURCE_DIR})
target_include_directories(ferry_pjrt_plugin SYSTEM PRIVATE "${FERRY_PJRT_INCLUDE_DIR}")
target_link_libraries(ferry_pjrt_plugin PRIVATE ferry ferry_build_options ${CMAKE_DL_LIBS})
# Only GetPjrtApi (and the counters) are exported. With the shared runtime (pip builds) the plugin
# links libferry.so, found beside it (RUNPATH $ORIGIN): the Python module and the plugin share one
# ferry, and a framework that loads the plugin alone (JAX, torch_xla) gets that ferry with it.
# With the static library, the copy of ferry inside the plugin stays private, so it never
# interposes on another copy in the process.
target_link_options(ferry_pjrt_plugin PRIVATE
  "LINKER:--version-script=${PROJECT_SOURCE_DIR}/src/plugin/exports.map")
set_property(TARGET ferry_pjrt_plugin APPEND PROPERTY LINK_DEPENDS
             "${PROJECT_SOURCE_DIR}/src/plugin/exports.map")

if(FERRY_BUILD_PYTHON)
  # `pip install .` puts it next to the Python package: ferry.jax.register() loads it from there.
  install(TARGETS ferry_pjrt_plugin LIBRARY DESTINATION ferry)
endif()

if(FERRY_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
  add_executable(ferry_plugin_tests tests/plugin/ferry_pjrt_plugin_test.cc)
  target_include_directories(ferry_plugin_tests PRIVATE ${PROJECT_SOURCE_DIR})
  target_include_directories(ferry_plugin_tests SYSTEM PRIVATE "${FERRY_PJRT_INCLUDE_DIR}")
  target_link_libraries(ferry_plugin_tests PRIVATE ferry ferry_build_options GTest::gtest
                                                   GTest::gtest_main ${CMAKE_DL_LIBS})
  target_compile_definitions(ferry_plugin_tests PRIVATE
    FERRY_PJRT_PLUGIN_PATH="$<TARGET_FILE:ferry_pjrt_plugin>")
  add_dependencies(ferry_plugin_tests ferry_pjrt_plugin)
  gtest_discover_tests(ferry_plugin_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS plugin TIMEOUT 300
                       ENVIRONMENT "FERRY_PJRT_SEARCH_PATH=${FERRY_PJRT_SITE_PACKAGES}")
  # Again with the same CPU plugin built at API 0.115 (a table longer than ferry's 0.81 header)
  # wrapped; skipped with the reason where lammps-jax-pjrt-cpu is not installed.
  gtest_discover_tests(ferry_plugin_tests TEST_PREFIX "api_0_115." DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS plugin TIMEOUT 300
                       ENVIRONMENT "FERRY_PJRT_SEARCH_PATH=${FERRY_PJRT_SITE_PACKAGES};FERRY_PJRT_PLUGIN=lammps_jax_pjrt_cpu;FERRY_PJRT_WRAPPED_PLUGIN=lammps_jax_pjrt_cpu")
endif()
