# cmake --install BUILD [--prefix P] puts:
#   lib/libdtrain.so.X.Y (SONAME libdtrain.so.X.Y, a 0.x series: minor = ABI), libdtrain.a
#   include/dtrain/*.h (dtrain/dtrain.h includes them all; dtrain/version.h)
#   bin/dtrain
#   lib/pkgconfig/dtrain.pc           pkg-config --cflags --libs dtrain (shared, with an
#                                     rpath to lib/); the archive: lib/libdtrain.a by path
#                                     and `pkg-config --static --libs` for its dependencies
#   lib/cmake/dtrain/dtrainConfig.cmake   find_package(dtrain) -> dtrain::dtrain
#     (the shared library; carries MPI and OpenMP usage requirements; OpenBLAS,
#     oneDNN, cJSON and zlib are its private dependencies)
# tests/scripts/test_install.sh installs into a temporary prefix and builds
# examples/ out of tree both ways.
include(CMakePackageConfigHelpers)
install(TARGETS dtrain_shared EXPORT dtrainTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS dtrain ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS dtrain_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/dtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/include/dtrain/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain)
install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/dtrainConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/dtrainConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/dtrainConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/dtrainConfig.cmake ${CMAKE_BINARY_DIR}/dtrainConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
# pkg-config: the static archive's own dependencies go in Libs.private
set(DT_PC_PRIVATE "-fopenmp -lopenblas -ldnnl -lcjson -lz -lm")
foreach(lib ${MPI_C_LIBRARIES})
  string(APPEND DT_PC_PRIVATE " ${lib}")
endforeach()
# relocatable: the prefix is found from the .pc file's own directory
file(RELATIVE_PATH _dt_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
set(DT_PC_PREFIX "\${pcfiledir}/${_dt_pc_up}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/dtrain.pc.in ${CMAKE_BINARY_DIR}/dtrain.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/dtrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
