# distopt_add_plugin(<name> SOURCES <src>... [TORCH | NO_TORCH] [NO_INSTALL]
#                    [LIBRARIES <lib>...])
#
# Builds a distopt plugin: a MODULE library exporting only
# dopt_plugin_init_v1 (hidden visibility), written to DISTOPT_PLUGIN_OUTPUT_DIR
# (default: <build>/plugins) and installed to DISTOPT_PLUGIN_INSTALL_DIR.
# It links libtorch whenever find_package(Torch) has run (the SDK's C++
# helpers, distopt/sdk/base/tensor.hpp and above, call libtorch); NO_TORCH
# leaves it out for a plugin on the C ABI and the torch-free headers only.
# TORCH (kept for older CMakeLists) requires it. NO_INSTALL: built, never
# installed (test plugins).
function(distopt_add_plugin name)
  cmake_parse_arguments(ARG "TORCH;NO_TORCH;NO_INSTALL" "" "SOURCES;LIBRARIES" ${ARGN})
  if(ARG_TORCH AND ARG_NO_TORCH)
    message(FATAL_ERROR "distopt_add_plugin(${name}): TORCH and NO_TORCH exclude each other")
  endif()
  if(ARG_TORCH AND NOT TORCH_LIBRARIES)
    message(FATAL_ERROR "distopt_add_plugin(${name} TORCH): libtorch not found "
                        "(find_package(distopt) or find_package(Torch) first)")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  set_target_properties(${name} PROPERTIES
    PREFIX "libdistopt_"
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(DEFINED DISTOPT_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${DISTOPT_PLUGIN_OUTPUT_DIR})
  endif()
  if(TARGET distopt::sdk)
    target_link_libraries(${name} PRIVATE distopt::sdk)
  else()
    target_link_libraries(${name} PRIVATE distopt_sdk)
  endif()
  if(TORCH_LIBRARIES AND NOT ARG_NO_TORCH)
    target_link_libraries(${name} PRIVATE ${TORCH_LIBRARIES})
  endif()
  # In distopt's own tree: libtorch's headers precompiled for TORCH plugins.
  if(ARG_TORCH AND COMMAND distopt_use_torch_pch)
    distopt_use_torch_pch(${name} plugin)
  endif()
  if(ARG_LIBRARIES)
    target_link_libraries(${name} PRIVATE ${ARG_LIBRARIES})
  endif()
  target_link_options(${name} PRIVATE -Wl,--no-undefined)
  if(DEFINED DISTOPT_PLUGIN_INSTALL_DIR AND NOT ARG_NO_INSTALL)
    install(TARGETS ${name} LIBRARY DESTINATION ${DISTOPT_PLUGIN_INSTALL_DIR})
  endif()
endfunction()
