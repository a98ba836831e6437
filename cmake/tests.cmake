# Test registration. Drop a file in the right folder and it becomes a test:
#   tests/unit/test_*.c  -> single-process cmocka test
#   tests/mpi/test_*.c   -> run under mpiexec -n 2 and -n 4 --oversubscribe
#   tests/slow/test_*.c  -> single process, label "slow" (long training runs)
# tests/common/*.c is shared helper code linked into every test.
file(GLOB DT_TEST_COMMON CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/common/*.c)
add_library(dt_testutil STATIC ${DT_TEST_COMMON} ${CMAKE_SOURCE_DIR}/tests/common/empty.c)
target_include_directories(dt_testutil PUBLIC ${CMAKE_SOURCE_DIR}/tests/common ${CMAKE_SOURCE_DIR}/src)
target_compile_definitions(dt_testutil PUBLIC _POSIX_C_SOURCE=200809L
  DT_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/tests/data"
  DT_CLI_PATH="$<TARGET_FILE:dtrain_cli>")
target_link_libraries(dt_testutil PUBLIC dtrain PkgConfig::CMOCKA)

set(DT_MPIEXEC ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root --bind-to none
    --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none)

function(dt_add_test_exe src)
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE dt_testutil)
  set(DT_LAST_TEST ${name} PARENT_SCOPE)
endfunction()

file(GLOB DT_UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/unit/test_*.c)
foreach(src ${DT_UNIT_TESTS})
  dt_add_test_exe(${src})
  add_test(NAME ${DT_LAST_TEST} COMMAND ${DT_LAST_TEST})
  set_tests_properties(${DT_LAST_TEST} PROPERTIES LABELS unit ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 900)
endforeach()

file(GLOB DT_MPI_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/mpi/test_*.c)
foreach(src ${DT_MPI_TESTS})
  dt_add_test_exe(${src})
  foreach(np 2 4)
    add_test(NAME ${DT_LAST_TEST}_np${np} COMMAND ${DT_MPIEXEC} -n ${np} $<TARGET_FILE:${DT_LAST_TEST}>)
    set_tests_properties(${DT_LAST_TEST}_np${np} PROPERTIES LABELS mpi PROCESSORS ${np}
      ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 600)
  endforeach()
endforeach()

file(GLOB DT_SLOW_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/slow/test_*.c)
foreach(src ${DT_SLOW_TESTS})
  dt_add_test_exe(${src})
  add_test(NAME ${DT_LAST_TEST} COMMAND ${DT_LAST_TEST})
  set_tests_properties(${DT_LAST_TEST} PROPERTIES LABELS slow ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 1800)
endforeach()
