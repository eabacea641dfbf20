# Install rules: the static libraries (the library, the tools library and the config-space
# archive they link), the public headers, the flash_attention program, and a CMake package
# so that consumers write
#
#   find_package(flash_attention 0.2 REQUIRED)
#   target_link_libraries(app PRIVATE flash_attention::flash_attention)  # or ::tools too
#
# Components: `dev` (library, headers, package files) and `cli`. The Python build
# installs only its own component (pyproject.toml), none of these.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(flash_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/flash_attention)

set_target_properties(fa_config PROPERTIES EXPORT_NAME config_space)
set_target_properties(flash_attention_tools PROPERTIES EXPORT_NAME tools)
install(TARGETS flash_attention flash_attention_tools fa_config
  EXPORT flash_attention_targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flash_attention
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
  FILES_MATCHING PATTERN "*.hpp")
install(EXPORT flash_attention_targets
  NAMESPACE flash_attention::
  FILE flash_attention-targets.cmake
  DESTINATION ${flash_cmake_dir} COMPONENT dev)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flash_attention-config.cmake.in
  ${PROJECT_BINARY_DIR}/flash_attention-config.cmake
  INSTALL_DESTINATION ${flash_cmake_dir})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flash_attention-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flash_attention-config.cmake
  ${PROJECT_BINARY_DIR}/flash_attention-config-version.cmake
  DESTINATION ${flash_cmake_dir} COMPONENT dev)

if(FLASH_BUILD_CLI)
  install(TARGETS flash_attention_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()
