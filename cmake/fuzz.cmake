# libFuzzer harnesses for the file readers (tests/fuzz/fuzz_*.c), built when
# DTRAIN_FUZZ=ON with clang: the whole library is then compiled with
# -fsanitize=fuzzer-no-link,address,undefined (CMakeLists.txt), and each
# harness links libFuzzer's main. Seeds: tests/fuzz/corpus/<harness>/.
# Run them: tests/scripts/run_fuzz.sh BUILD_DIR SECONDS (scripts/test.sh does).
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "DTRAIN_FUZZ needs clang (cmake -DCMAKE_C_COMPILER=clang -DDTRAIN_FUZZ=ON ...)")
endif()
file(GLOB DT_FUZZ_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.c)
add_custom_target(fuzz_all)
foreach(src ${DT_FUZZ_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_compile_definitions(${name} PRIVATE _POSIX_C_SOURCE=200809L)
  target_link_libraries(${name} PRIVATE dtrain)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  add_dependencies(fuzz_all ${name})
endforeach()
