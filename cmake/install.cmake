# Install rules of the C++ package: public headers, the vendored dlpack.h, libmsa.a and the CMake
# package (find_package(msa CONFIG) -> msa::msa). tools/cli installs the msa binary. The wheel
# runs the same rules with its install folders moved under msa/ (pyproject.toml).
if(NOT MSA_INSTALL)
  return()
endif()
include(CMakePackageConfigHelpers)
set(MSA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/msa)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/msa DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT development FILES_MATCHING PATTERN "*.h")
# The license travels with the header, as Apache-2.0 asks of redistributions.
install(FILES ${PROJECT_SOURCE_DIR}/third_party/dlpack/include/dlpack/dlpack.h
              ${PROJECT_SOURCE_DIR}/third_party/dlpack/LICENSE
        DESTINATION ${MSA_INSTALL_DLPACK_DIR}/dlpack COMPONENT development)
install(TARGETS msa EXPORT msaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
install(EXPORT msaTargets NAMESPACE msa:: DESTINATION ${MSA_INSTALL_CMAKEDIR}
        COMPONENT development)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/msaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/msaConfig.cmake
                              INSTALL_DESTINATION ${MSA_INSTALL_CMAKEDIR})
# 0.x releases may change the API between minor versions.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/msaConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/msaConfig.cmake ${PROJECT_BINARY_DIR}/msaConfigVersion.cmake
        DESTINATION ${MSA_INSTALL_CMAKEDIR} COMPONENT development)
