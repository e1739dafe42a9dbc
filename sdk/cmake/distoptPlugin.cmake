# distopt_add_plugin(<name> SOURCES <src>... [TORCH] [LIBRARIES <lib>...])
#
# Builds a distopt plugin: a MODULE library exporting only
# dopt_plugin_init_v1 (hidden visibility), written to DISTOPT_PLUGIN_OUTPUT_DIR
# (default: <build>/plugins) and installed to DISTOPT_PLUGIN_INSTALL_DIR.
# TORCH links libtorch (for plugins that do tensor math with it).
function(distopt_add_plugin name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;LIBRARIES" ${ARGN})
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
  if(ARG_TORCH)
    target_link_libraries(${name} PRIVATE ${TORCH_LIBRARIES})
  endif()
  if(ARG_LIBRARIES)
    target_link_libraries(${name} PRIVATE ${ARG_LIBRARIES})
  endif()
  target_link_options(${name} PRIVATE -Wl,--no-undefined)
  if(DEFINED DISTOPT_PLUGIN_INSTALL_DIR)
    install(TARGETS ${name} LIBRARY DESTINATION ${DISTOPT_PLUGIN_INSTALL_DIR})
  endif()
endfunction()
