# Install rules: binaries, public headers, the static libraries and a CMake package `ddpvision`
# with exported targets, so that another project can `find_package(ddpvision)` and link
# `ddpvision::ddpv`. Included (OPTIONAL) at the end of the top-level CMakeLists.txt, after every
# target exists. Also installs the job scripts under share/ddpvision/jobs.
include(CMakePackageConfigHelpers)

set(DDPV_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddpvision)
set(_ddpv_libs ddpv_core ddpv_h5 ddpv_backend ddpv_nn ddpv_dist ddpv_data ddpv_train ddpv)
set(_ddpv_exported "")
foreach(lib ${_ddpv_libs})
  if(TARGET ${lib})
    list(APPEND _ddpv_exported ${lib})
  endif()
endforeach()

install(TARGETS ${_ddpv_exported} EXPORT ddpvisionTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/ddpv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ddpvisionTargets NAMESPACE ddpvision:: DESTINATION ${DDPV_INSTALL_CMAKEDIR})

# Programs: every executable of src/apps and data-tools. The RPATH keeps the link-time paths of
# HDF5, oneDNN and MPI when they live outside the system folders (a site's module tree), so
# that the installed programs run without the build's environment.
set(_ddpv_programs "")
foreach(dir ${CMAKE_SOURCE_DIR}/src/apps ${CMAKE_SOURCE_DIR}/data-tools)
  get_property(_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${_targets})
    get_target_property(_type ${t} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      list(APPEND _ddpv_programs ${t})
    endif()
  endforeach()
endforeach()
if(_ddpv_programs)
  set_target_properties(${_ddpv_programs} PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS ${_ddpv_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/jobs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ddpvision/jobs
        USE_SOURCE_PERMISSIONS)

# Note [Dependencies of the exported targets]
# Static libraries carry their link dependencies to the consumer (as $<LINK_ONLY:...>), so the
# package config must find every imported target they name (MPI::MPI_C, HDF5::HDF5,
# DNNL::dnnl, ...). The list is read from the targets themselves rather than written out, so
# that a layer gaining a dependency cannot silently break find_package(ddpvision).
set(_ddpv_links "")
foreach(lib ${_ddpv_exported})
  foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    get_target_property(_l ${lib} ${prop})
    if(_l)
      list(APPEND _ddpv_links ${_l})
    endif()
  endforeach()
endforeach()
string(JOIN ";" _ddpv_links_str ${_ddpv_links})
set(DDPV_FIND_DEPENDENCIES "")
macro(_ddpv_dep pattern call)
  if(_ddpv_links_str MATCHES "${pattern}")
    string(APPEND DDPV_FIND_DEPENDENCIES "${call}\n")
  endif()
endmacro()
_ddpv_dep("Threads::" "find_dependency(Threads)")
if(_ddpv_links_str MATCHES "MPI::MPI_CXX")
  _ddpv_dep("MPI::" "find_dependency(MPI COMPONENTS C CXX)")
else()
  _ddpv_dep("MPI::" "find_dependency(MPI COMPONENTS C)")
endif()
_ddpv_dep("HDF5::" "find_dependency(HDF5 COMPONENTS C)")
_ddpv_dep("DNNL::" "find_dependency(dnnl)")
_ddpv_dep("OpenMP::" "find_dependency(OpenMP)")
_ddpv_dep("ZLIB::" "find_dependency(ZLIB)")
_ddpv_dep("JPEG::" "find_dependency(JPEG)")
_ddpv_dep("PNG::" "find_dependency(PNG)")
_ddpv_dep("CUDA::" "find_dependency(CUDAToolkit)")
string(REGEX MATCHALL "Boost::[A-Za-z_]+" _boost_targets "${_ddpv_links_str}")
if(_boost_targets)
  list(REMOVE_DUPLICATES _boost_targets)
  list(TRANSFORM _boost_targets REPLACE "Boost::" "")
  list(REMOVE_ITEM _boost_targets headers boost)
  string(JOIN " " _boost_components ${_boost_targets})
  string(APPEND DDPV_FIND_DEPENDENCIES "find_dependency(Boost COMPONENTS ${_boost_components})\n")
endif()
# Where the build found its dependencies, as hints for a consumer on the same site.
set(DDPV_DEPENDENCY_HINTS "")
foreach(var dnnl_DIR HDF5_ROOT dnnl_ROOT CUDAToolkit_ROOT MPI_C_COMPILER)
  if(${var})
    string(APPEND DDPV_DEPENDENCY_HINTS "if(NOT ${var})\n  set(${var} \"${${var}}\")\nendif()\n")
  endif()
endforeach()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ddpvisionConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ddpvisionConfig.cmake INSTALL_DESTINATION ${DDPV_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddpvisionConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddpvisionConfig.cmake
              ${CMAKE_BINARY_DIR}/ddpvisionConfigVersion.cmake
        DESTINATION ${DDPV_INSTALL_CMAKEDIR})
