# Finds the PJRT C API header (pjrt_c_api.h) that the pjrt backend and ferry_pjrt_plugin.so are
# compiled against. It is a build requirement, like abseil: with FERRY_PJRT on (the default) a
# configure that cannot find it fails and says how to get it; only an explicit -DFERRY_PJRT=OFF
# builds ferry without the backend and the plugin.
#
# Where the header is looked for, first found wins:
#   1. FERRY_PJRT_C_API_INCLUDE_DIR, when the user set it (then it must hold the header);
#   2. the xla-cpu-pjrt wheel (which ships it) as seen by each of these interpreters:
#      Python_EXECUTABLE (scikit-build-core passes the build interpreter: under `pip install` with
#      build isolation that is the isolated environment, which has pyproject.toml's
#      [build-system].requires, xla-cpu-pjrt among them), then the project's .venv
#      (scripts/python_env.sh), then the first python3 on PATH.
#
# Nothing of the search is cached: every configure looks again, so a build configured before the
# environment existed never keeps a stale answer. The header found is copied into the build tree
# (pjrt_include/) and compiled from there: the compile commands then name a folder under the build
# tree, never a temporary build environment, and a compiler cache hits across builds.
#
# Sets: FERRY_HAVE_PJRT (ON/OFF), FERRY_PJRT_INCLUDE_DIR (the build tree's copy),
# FERRY_PJRT_HEADER_FOUND_IN (where the header was found) and
# FERRY_PJRT_SITE_PACKAGES (the site-packages of the wheel that gave the header, "" when it lies in
# a temporary build environment).

option(FERRY_PJRT "Build the pjrt backend and ferry_pjrt_plugin.so (needs pjrt_c_api.h)" ON)
set(FERRY_PJRT_C_API_INCLUDE_DIR "" CACHE PATH
    "Folder holding pjrt_c_api.h (default: found through Python in the xla-cpu-pjrt wheel)")

set(FERRY_HAVE_PJRT OFF)
set(FERRY_PJRT_INCLUDE_DIR "")
set(FERRY_PJRT_SITE_PACKAGES "")

function(_ferry_pjrt_header_from_python interpreter out_dir)
  set(${out_dir} "" PARENT_SCOPE)
  if(NOT interpreter OR NOT EXISTS "${interpreter}")
    return()
  endif()
  execute_process(
    COMMAND "${interpreter}" -c
            "import importlib.util as u, os; s = u.find_spec('xla_plugins.xla_cpu_pjrt'); print(os.path.join(os.path.dirname(s.origin), 'include') if s and s.origin else '')"
    OUTPUT_VARIABLE include_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
  if(NOT failed AND include_dir AND EXISTS "${include_dir}/pjrt_c_api.h")
    set(${out_dir} "${include_dir}" PARENT_SCOPE)
  endif()
endfunction()

if(FERRY_PJRT)
  set(ferry_pjrt_header_dir "")
  set(ferry_pjrt_looked_in "")
  if(FERRY_PJRT_C_API_INCLUDE_DIR)
    if(NOT EXISTS "${FERRY_PJRT_C_API_INCLUDE_DIR}/pjrt_c_api.h")
      message(FATAL_ERROR "ferry: FERRY_PJRT_C_API_INCLUDE_DIR=${FERRY_PJRT_C_API_INCLUDE_DIR} "
                          "holds no pjrt_c_api.h")
    endif()
    set(ferry_pjrt_header_dir "${FERRY_PJRT_C_API_INCLUDE_DIR}")
  else()
    find_program(ferry_path_python3 NAMES python3 NO_CACHE)
    foreach(interpreter IN ITEMS "${Python_EXECUTABLE}" "${Python3_EXECUTABLE}"
                                 "${PROJECT_SOURCE_DIR}/.venv/bin/python" "${ferry_path_python3}")
      if(NOT interpreter OR NOT EXISTS "${interpreter}")
        continue()
      endif()
      list(APPEND ferry_pjrt_looked_in "${interpreter}")
      _ferry_pjrt_header_from_python("${interpreter}" found)
      if(found)
        set(ferry_pjrt_header_dir "${found}")
        break()
      endif()
    endforeach()
  endif()

  if(NOT ferry_pjrt_header_dir)
    list(JOIN ferry_pjrt_looked_in ", " looked_in)
    message(FATAL_ERROR
      "ferry: no PJRT C API header (pjrt_c_api.h). The pjrt backend and ferry_pjrt_plugin.so need "
      "it; it ships in the xla-cpu-pjrt wheel. Any one of:\n"
      "  - scripts/python_env.sh --build (installs it into .venv, where this configure looks);\n"
      "  - pip install xla-cpu-pjrt into the Python that runs CMake (looked in: ${looked_in});\n"
      "  - -DFERRY_PJRT_C_API_INCLUDE_DIR=<folder holding pjrt_c_api.h>;\n"
      "  - -DFERRY_PJRT=OFF to build ferry without the pjrt backend and the plugin "
      "(pip: -C cmake.define.FERRY_PJRT=OFF).")
  endif()

  configure_file("${ferry_pjrt_header_dir}/pjrt_c_api.h"
                 "${PROJECT_BINARY_DIR}/pjrt_include/pjrt_c_api.h" COPYONLY)
  set(FERRY_PJRT_INCLUDE_DIR "${PROJECT_BINARY_DIR}/pjrt_include")
  set(FERRY_PJRT_HEADER_FOUND_IN "${ferry_pjrt_header_dir}")
  set(FERRY_HAVE_PJRT ON)
  # site-packages of the header's wheel: where the tests find the plugins (FERRY_PJRT_SEARCH_PATH),
  # and the last place a ferry built from a source tree looks for one. A header from a temporary
  # build environment (pip's build isolation) names no such folder: it is gone after the build.
  get_filename_component(site_packages "${ferry_pjrt_header_dir}/../../.." ABSOLUTE)
  if(NOT site_packages MATCHES "/pip-build-env-|/build-env-")
    set(FERRY_PJRT_SITE_PACKAGES "${site_packages}")
  endif()
  message(STATUS "ferry: pjrt backend and plugin with ${ferry_pjrt_header_dir}/pjrt_c_api.h")
else()
  message(STATUS "ferry: pjrt backend and plugin left out (FERRY_PJRT=OFF)")
endif()
