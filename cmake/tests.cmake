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

# The CLI's flag parsing, tested in process: it links the CLI's code.
target_link_libraries(test_cli_flags PRIVATE dtrain_cli_lib)
target_link_libraries(test_cli_elastic PRIVATE dtrain_cli_lib)
target_link_libraries(test_cli_launch_here PRIVATE dtrain_cli_lib)

# The progress mode comes from DTRAIN_PROGRESS, which dt_dist_init honours
# (tests/common/mpi_check.h: t_init checks the mode matches it). Every MPI
# test runs in POLL mode at np 2 and 4; the communication tests below run again
# in THREAD mode at np 2 and 4 (name suffix _thread_npN).
set(DT_MPI_THREAD_TESTS test_dist_collectives test_dist_deterministic test_dist_shm test_dist_agree test_dist_hier
    test_dist_watchdog test_dist_debug_collectives
    test_ddp_equivalence test_ddp_hooks test_ddp_join test_ddp_accum test_ddp_buffers test_zero_wire
    test_dist_machine test_zero_node_params test_dist_node_allreduce)
file(GLOB DT_MPI_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/mpi/test_*.c)
foreach(src ${DT_MPI_TESTS})
  dt_add_test_exe(${src})
  foreach(np 2 4)
    add_test(NAME ${DT_LAST_TEST}_np${np} COMMAND ${DT_MPIEXEC} -n ${np} $<TARGET_FILE:${DT_LAST_TEST}>)
    set_tests_properties(${DT_LAST_TEST}_np${np} PROPERTIES LABELS mpi PROCESSORS ${np}
      ENVIRONMENT "OMP_NUM_THREADS=1;DTRAIN_PROGRESS=poll" TIMEOUT 600 SKIP_RETURN_CODE 77)
  endforeach()
  if(DT_LAST_TEST IN_LIST DT_MPI_THREAD_TESTS)
    foreach(np 2 4)
      add_test(NAME ${DT_LAST_TEST}_thread_np${np} COMMAND ${DT_MPIEXEC} -n ${np} $<TARGET_FILE:${DT_LAST_TEST}>)
      set_tests_properties(${DT_LAST_TEST}_thread_np${np} PROPERTIES LABELS mpi PROCESSORS ${np}
        ENVIRONMENT "OMP_NUM_THREADS=1;DTRAIN_PROGRESS=thread" TIMEOUT 600 SKIP_RETURN_CODE 77)
    endforeach()
  endif()
endforeach()
foreach(name ${DT_MPI_THREAD_TESTS})
  if(NOT TARGET ${name})
    message(FATAL_ERROR "DT_MPI_THREAD_TESTS names ${name}, which is not a tests/mpi program")
  endif()
endforeach()

# The same equivalences on simulated machines (DTRAIN_TEST_MACHINES: the
# library believes in 2 x 2 and 3 + 1 machines on this one), so DDP and ZeRO
# run the hierarchical collectives (dist.h section 10) wherever ctest runs;
# tests/scripts/test_multihost.sh runs real hosts (network namespaces).
foreach(t test_ddp_equivalence test_zero_equivalence test_zero_stage3 test_dist_machine test_zero_node_params
          test_dist_node_allreduce test_zero_sync_bn)
  foreach(m "2x2;0,0,1,1" "3p1;0,0,0,1")
    list(GET m 0 tag)
    list(GET m 1 ids)
    add_test(NAME ${t}_machines${tag}_np4 COMMAND ${DT_MPIEXEC} -n 4 $<TARGET_FILE:${t}>)
    set_tests_properties(${t}_machines${tag}_np4 PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 600
      ENVIRONMENT "OMP_NUM_THREADS=1;DTRAIN_PROGRESS=poll;DTRAIN_TEST_MACHINES=${ids}")
  endforeach()
endforeach()

file(GLOB DT_SLOW_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/slow/test_*.c)
foreach(src ${DT_SLOW_TESTS})
  dt_add_test_exe(${src})
  add_test(NAME ${DT_LAST_TEST} COMMAND ${DT_LAST_TEST})
  set_tests_properties(${DT_LAST_TEST} PROPERTIES LABELS slow ENVIRONMENT "OMP_NUM_THREADS=2" TIMEOUT 1800)
endforeach()

# The example trains (its loss falls) with DDP and ZeRO-3, with and without
# recompute, on Fashion-MNIST (Debian's dataset-fashion-mnist).
# (the second word: what the result line must say ran; _ for a space)
foreach(cfg "ddp;ddp;2;" "zero3;zero;2;--zero;3" "ddp_recompute;ddp_with_recompute;4;--recompute"
        "zero3_recompute;zero_with_recompute;4;--zero;3;--recompute")
  list(GET cfg 0 tag)
  list(GET cfg 1 what)
  string(REPLACE "_" " " what "${what}")
  list(GET cfg 2 np)
  list(SUBLIST cfg 3 -1 extra)
  add_test(NAME example_resmlp_${tag}_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_example_resmlp.sh "${what}" 40
                   ${DT_MPIEXEC} -n ${np} $<TARGET_FILE:resmlp> --steps 40 ${extra})
  set_tests_properties(example_resmlp_${tag}_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600
    ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()

# Checkpoints from before the block rewrite still resume and train on as then.
add_test(NAME test_pre_blocks_checkpoints
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_pre_blocks_checkpoints.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_pre_blocks_checkpoints PROPERTIES LABELS unit TIMEOUT 300)

# --resume takes the checkpoint's --seed (data order, dropout): bit for bit
# without repeating it; a contradicting --seed is refused.
add_test(NAME test_resume_seed
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_resume_seed.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_resume_seed PROPERTIES LABELS unit TIMEOUT 300)

# --recompute blocks is bitwise --recompute none, in one process and at 2/4 ranks.
add_test(NAME test_recompute_bitwise
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_recompute_bitwise.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_recompute_bitwise PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 600)

# Test tools (not tests themselves): ckpt_cmp compares two checkpoints bitwise.
add_executable(ckpt_cmp ${CMAKE_SOURCE_DIR}/tests/tools/ckpt_cmp.c)
target_link_libraries(ckpt_cmp PRIVATE dtrain)
# wd_waits: a late rank against the waits outside dt_work_wait (test_watchdog_waits).
add_executable(wd_waits ${CMAKE_SOURCE_DIR}/tests/tools/wd_waits.c)
target_link_libraries(wd_waits PRIVATE dtrain)
foreach(np 2 4)
  add_test(NAME test_watchdog_waits_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_watchdog_waits.sh $<TARGET_FILE:wd_waits> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_watchdog_waits_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()
# ckpt_bf16 counts the checkpoint values bfloat16 cannot hold (test_optim_bf16).
add_executable(ckpt_bf16 ${CMAKE_SOURCE_DIR}/tests/tools/ckpt_bf16.c)
target_link_libraries(ckpt_bf16 PRIVATE dtrain)

# GPT-2 with dropout: one process == --accum == DDP == ZeRO-1 == --pp 2 ==
# recompute bit for bit (masks keyed by sample position, not a generator).
add_test(NAME test_dropout_bitwise
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_dropout_bitwise.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_dropout_bitwise PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 300)

# Pipeline parallelism equals one process (and DDP) bit for bit, every
# schedule, checkpoints across layouts (launches dtrain --nproc itself).
foreach(np 2 4)
  add_test(NAME test_pipeline_bitwise_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_pipeline_bitwise.sh $<TARGET_FILE:dtrain_cli>
                   $<TARGET_FILE:ckpt_cmp> ${np})
  set_tests_properties(test_pipeline_bitwise_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()
# --pp-wire bf16|fp16: the pipeline's messages rounded to 16 bits; the same
# bits under every schedule, reducer and chunking with the same cuts, within
# 1e-4 of the float32 wire (np 2: the 2-rank cases; np 4: replicas, 4 stages).
foreach(np 2 4)
  add_test(NAME test_pipeline_wire_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_pipeline_wire.sh $<TARGET_FILE:dtrain_cli>
                   $<TARGET_FILE:ckpt_cmp> ${np})
  set_tests_properties(test_pipeline_wire_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 300)
endforeach()
# Tensor parallelism (--tp) equals one process and DDP within 1e-6; whole-
# tensor checkpoints across layouts; refusals (launches dtrain --nproc itself).
foreach(np 2 4)
  add_test(NAME test_tensor_parallel_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_tensor_parallel.sh $<TARGET_FILE:dtrain_cli> ${np})
  set_tests_properties(test_tensor_parallel_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 300)
endforeach()
# The mesh dp x pp x tp: tensor-parallel pipeline stages equal one process
# within 1e-6 (four schedules, --clip), resharding (1,2,2) -> (2,1,2) -> one
# process (launches dtrain --nproc 4 itself).
# TP groups and machines without namespaces: node-shared sums == MPI's,
# simulated machines (DTRAIN_TEST_MACHINES), refused placements
add_test(NAME test_tp_node_np4
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_tp_node.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_tp_node_np4 PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 300)
# The full mesh dp 2 x pp 2 x tp 2 at 8 ranks against DDP on 2, checkpoints across layouts
add_test(NAME test_tp_mesh8_np8
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_tp_mesh8.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_tp_mesh8_np8 PROPERTIES LABELS mpi PROCESSORS 8 TIMEOUT 300)
add_test(NAME test_tp_pipeline_np4
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_tp_pipeline.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_tp_pipeline_np4 PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 300)
# ZeRO 1/2/3 over the replicas of a tensor-parallel mesh (dp 2 x tp 2):
# bitwise the mesh with DDP (clip, SGD, fp16 skips), whole-tensor checkpoints
# across layouts, the per-rank memory report, refusals; with
# --sequence-parallel bitwise the mesh with DDP too (and with --pp).
# Label slow: about 80 s under ASan, where test_tensor_parallel_np2 runs the
# same code (tp/zero.c, the shard sum of seq.c) at dp 1 with --zero 1 / 3.
add_test(NAME test_tp_zero_np4
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_tp_zero.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_tp_zero_np4 PROPERTIES LABELS "mpi;slow" PROCESSORS 4 TIMEOUT 300)
foreach(np 2 4)
  add_test(NAME test_pipeline_errors_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_pipeline_errors.sh $<TARGET_FILE:dtrain_cli> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_pipeline_errors_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
  add_test(NAME test_output_paths_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_output_paths.sh $<TARGET_FILE:dtrain_cli> ${np})
  set_tests_properties(test_output_paths_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
  add_test(NAME test_pipeline_faults_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_pipeline_faults.sh $<TARGET_FILE:dtrain_cli> ${np})
  set_tests_properties(test_pipeline_faults_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()
# ZeRO-3 inside pipeline stages (P = 2 x D = 2): bitwise --pp 2 with DDP and
# ZeRO-2 per stage, schedules, clipping, checkpoints across layouts.
add_test(NAME test_pipeline_zero3_np4
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_pipeline_zero3.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_pipeline_zero3_np4 PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 600)

# --node-params through the CLI on simulated machines (DTRAIN_TEST_MACHINES):
# bitwise the private-parameter runs, resumable, refused without --zero.
add_test(NAME test_node_params_cli
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_node_params_cli.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_node_params_cli PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 600)

# Background checkpoints: the same bytes as --save-sync (DDP, ZeRO consolidated),
# sharded and pipeline sets committed and resumable.
add_test(NAME test_save_background
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_save_background.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_save_background PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 600)
# A kill -9 mid-write of a background save, 20 times (single file, ZeRO-2
# sharded set): the previous checkpoint loads, the partial one is ignored.
add_test(NAME test_save_kill COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_save_kill.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_save_kill PROPERTIES LABELS "mpi;slow" PROCESSORS 2 TIMEOUT 600)

# --max-restarts (issue 28): a rank killed at random steps 5 times in one run,
# DDP, ZeRO-2, pipeline, at 2 and 4 ranks: completes, final checkpoint bitwise
# the uninterrupted run's, metrics without repeats. Label slow (a few minutes:
# 6 launches per strategy); the sanitizer pass leaves it to the Release run.
foreach(np 2 4)
  add_test(NAME test_restart_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_restart.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp> ${np})
  set_tests_properties(test_restart_np${np} PROPERTIES LABELS "mpi;slow" PROCESSORS ${np} TIMEOUT 900)
endforeach()

# --zero with --compress bf16|fp16 (and --no-shm) trains GPT-2 through the
# CLI (--nproc 2); a bad --compress value is refused.
add_test(NAME test_zero_wire_cli
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_zero_wire_cli.sh $<TARGET_FILE:dtrain_cli>
                 $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_zero_wire_cli PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 600)

# Ranks started with different settings (MPMD) fail at start-up naming the
# setting and the ranks (configuration agreement, dist.h section 8).
foreach(np 2 4)
  add_test(NAME test_config_agreement_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_config_agreement.sh $<TARGET_FILE:dtrain_cli> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_config_agreement_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 900)
endforeach()

# A SIGSTOPped rank is named by the others' stall warning; with
# --collective-timeout the job ends with an error (dist.h section 9).
foreach(np 2 4)
  add_test(NAME test_collective_watchdog_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_collective_watchdog.sh $<TARGET_FILE:dtrain_cli> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_collective_watchdog_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()

# SIGTERM / SIGINT / SIGHUP mid-run: every rank stops after the same step,
# saves (file, ZeRO shards, pipeline), says so once, exits 128 + signal; the
# checkpoint resumes bit-identically. np 1: one process; np 2/4: one rank
# signalled under mpiexec, and the --nproc launcher (also SIGKILLed: mpirun
# and the ranks end with it).
foreach(np 1 2 4)
  add_test(NAME test_signal_stop_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_signal_stop.sh $<TARGET_FILE:dtrain_cli>
                   $<TARGET_FILE:ckpt_cmp> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_signal_stop_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 900)
endforeach()
set_tests_properties(test_signal_stop_np1 PROPERTIES LABELS unit)

# A multi-rank error prints one line per job, no MPI_ABORT banner.
foreach(np 2 4)
  add_test(NAME test_one_error_line_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_one_error_line.sh $<TARGET_FILE:dtrain_cli> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_one_error_line_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()

# --freeze: matching parameters keep their initial values bit for bit (wd 0.1,
# momentum), one process (np 1), DDP and ZeRO 1/2/3 (np 2, 4); an unmatched
# pattern is an error naming it.
foreach(np 1 2 4)
  add_test(NAME test_freeze_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_freeze.sh $<TARGET_FILE:dtrain_cli>
                   $<TARGET_FILE:ckpt_cmp> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_freeze_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 900)
endforeach()
set_tests_properties(test_freeze_np1 PROPERTIES LABELS unit)

# --no-decay / --lr-scale: equivalences that hold bit for bit (no decay for
# every parameter == --wd 0; lr x 0.5 == half the lr; lr x 0 keeps values),
# one process, DDP and ZeRO 2; malformed and unmatched patterns refused.
foreach(np 1 2 4)
  add_test(NAME test_param_groups_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_param_groups.sh $<TARGET_FILE:dtrain_cli>
                   $<TARGET_FILE:ckpt_cmp> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_param_groups_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 900)
endforeach()
set_tests_properties(test_param_groups_np1 PROPERTIES LABELS unit)

# --uneven: a text directory split by file over --nproc 2 (ranks hold different
# numbers of batches); DDP and ZeRO 1/2 train to the end through join, every
# rank at the same final step; unsupported combinations fail naming the flag.
add_test(NAME test_uneven_np2
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_uneven.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_uneven_np2 PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 600)

# Simulated hosts (../shared/tools/netsim.sh, network namespaces): DDP, ZeRO
# and pp x dp across 2 x 2 and 3 + 1 ranks equal one machine bit for bit; the
# watchdog names a stopped rank on the other host. Skipped (77) without
# namespaces or without ../shared.
# slow_start holds the ranks of one simulated host before main() (a slow machine).
add_library(slow_start MODULE ${CMAKE_SOURCE_DIR}/tests/tools/slow_start.c)
add_test(NAME test_multihost
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_multihost.sh $<TARGET_FILE:dtrain_cli>
                 $<TARGET_FILE:ckpt_cmp> ${CMAKE_SOURCE_DIR}/../shared/tools/netsim.sh $<TARGET_FILE:slow_start>)
# (Release pass only: a minute of TCP between namespaces; the hierarchical
# collectives it runs have their own sanitizer tests, test_dist_hier and the
# simulated-machine twins)
set_tests_properties(test_multihost PROPERTIES LABELS "mpi;slow" PROCESSORS 4 TIMEOUT 600 SKIP_RETURN_CODE 77)
# Tensor-parallel groups on simulated hosts: dp 2 x tp 2 on 2 x 2 ranks equals
# one machine bit for bit, only the DP all-reduce's bytes cross the link, and
# layouts that put a TP group across hosts are refused. (Release pass only, like
# test_multihost: 20-30 s of TCP between namespaces; its code paths have
# sanitizer twins in test_tp_node and test_dist_node_allreduce.)
add_test(NAME test_tp_multihost
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_tp_multihost.sh $<TARGET_FILE:dtrain_cli>
                 $<TARGET_FILE:ckpt_cmp> ${CMAKE_SOURCE_DIR}/../shared/tools/netsim.sh)
set_tests_properties(test_tp_multihost PROPERTIES LABELS "mpi;slow" PROCESSORS 4 TIMEOUT 300 SKIP_RETURN_CODE 77)
# Elastic restarts on simulated hosts: a machine lost mid-run, the job goes on
# with the ranks left (--min-nproc; global batch kept) or on a spare machine.
add_test(NAME test_elastic
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_elastic.sh $<TARGET_FILE:dtrain_cli>
                 ${CMAKE_SOURCE_DIR}/../shared/tools/netsim.sh)
set_tests_properties(test_elastic PROPERTIES LABELS "mpi;slow" PROCESSORS 4 TIMEOUT 600 SKIP_RETURN_CODE 77)

# The multi-machine launcher: --hosts / --hostfile / Slurm to an mpirun
# command (--print-launch) and the refusals of bad input.
add_test(NAME test_launch_hosts
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_launch_hosts.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_launch_hosts PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 120)

# Install and link it: cmake --install into a temporary prefix, examples/
# built out of tree with pkg-config (shared and static) and find_package,
# run at 2 ranks. (Not in sanitizer builds: the installed library would need
# the consumer built with the same sanitizers.)
if(NOT DTRAIN_SANITIZE AND NOT DTRAIN_TSAN AND NOT DTRAIN_FUZZ)
  add_test(NAME test_install
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR} ${DT_MPIEXEC})
  set_tests_properties(test_install PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 600)
endif()

# --metrics never appends through another user's link in a sticky directory
# (issue 31 item 4); needs root for setpriv, else skipped (77).
add_test(NAME test_metrics_symlink
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_metrics_symlink.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_metrics_symlink PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)

# A sharded --save refuses another user's planted link (sticky directory),
# another user's directory and a world-writable one, naming path, uid and
# why; a single-file --save replaces a planted link, never its target (issue
# 31 item 5); needs root for setpriv, else skipped (77).
add_test(NAME test_save_dir_owner
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_save_dir_owner.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_save_dir_owner PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300 SKIP_RETURN_CODE 77)

# A sharded save that fails on one rank (a full tmpfs, 4-rank ZeRO-2,
# background and --save-sync) fails on every rank: one error line naming the
# file and the cause, no new shard or temp file left, the previous set loads
# (issue 31 item 6); needs mount, else skipped (77).
add_test(NAME test_save_full_disk
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_save_full_disk.sh $<TARGET_FILE:dtrain_cli> 4)
set_tests_properties(test_save_full_disk PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 300 SKIP_RETURN_CODE 77)

# The memory check before allocating (issue 31 item 7): a GPT-2 in a memory
# cgroup smaller than it is refused before step 1 with the estimate and the
# figure it exceeded (one process and 2 ranks); --no-memory-check gets past
# it. Needs a memory cgroup it can create, else skipped (77).
add_test(NAME test_memory_check
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_memory_check.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_memory_check PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300 SKIP_RETURN_CODE 77)

# A step never spans two epochs: --accum, a pipeline and DDP with micro-batches
# train on one process's samples over 3 epochs with a tail (src/train/trainer.c)
add_test(NAME test_epoch_tail
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_epoch_tail.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_epoch_tail PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 300)

# --freeze checkpoints move between layouts: one process -> ZeRO 1/3, a
# pipeline (x ZeRO replicas), tp x ZeRO-3, and ZeRO / pipeline -> one process
add_test(NAME test_freeze_layouts
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_freeze_layouts.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_freeze_layouts PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 300)

# Checkpoints drive the CLI (issue 27): eval --init / --resume of MLP, CNN and
# GPT-2 files, ZeRO-3 and pipeline sets without model flags equals eval with
# them; a flag contradicting the file is refused naming both values.
add_test(NAME test_eval_checkpoint
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_eval_checkpoint.sh $<TARGET_FILE:dtrain_cli>)
# label slow: about 24 full Fashion-MNIST evaluations (15-40 s here, 276 s under
# ASan): the sanitizer pass (-LE slow) leaves it to the Release run
set_tests_properties(test_eval_checkpoint PROPERTIES LABELS "mpi;slow" PROCESSORS 2 TIMEOUT 900)

# Impossible combinations are refused before step 1, with no progress line
# and no checkpoint (issue 27 item 6): pipeline + --unfreeze-at, an empty
# validation split, a batch beyond the training split, --pp with
# --save-format consolidated.
add_test(NAME test_refuse_upfront
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_refuse_upfront.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_refuse_upfront PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300)

# dtrain generate (issue 27 item 3): a tiny GPT-2 trained on a repetitive
# text continues it; the KV cache equals the whole-prefix recompute; same
# seed same text; ids for other vocabularies; refusals name the flag.
add_test(NAME test_generate_cli
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_generate_cli.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_generate_cli PROPERTIES LABELS unit TIMEOUT 300)

# dtrain inspect (issue 27 item 4) on every checkpoint kind (one process,
# DDP, ZeRO-2 set, ZeRO-1 consolidated, pipeline set; --nproc 2): a flipped
# bit names the tensor (exit 1), a truncated file or shard is one error line.
add_test(NAME test_inspect_cli_np2
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_inspect_cli.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_inspect_cli_np2 PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 600)

# Issue 31: a stop is honoured at every moment, one writer per checkpoint
# directory. SIGTERM 0-150 ms after `dtrain train --nproc N` starts: exit 143,
# nothing left, never a hang; SIGTERM during the final evaluation: exit 143
# within seconds (one process, the launcher, one rank under mpiexec); a second
# job saving into a sharded directory in use is refused at start naming the
# holder, which goes on unharmed.
foreach(np 2 4)
  add_test(NAME test_stop_at_launch_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_stop_at_launch.sh $<TARGET_FILE:dtrain_cli> ${np})
  set_tests_properties(test_stop_at_launch_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
  add_test(NAME test_ckpt_dir_lock_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_ckpt_dir_lock.sh $<TARGET_FILE:dtrain_cli> ${np})
  set_tests_properties(test_ckpt_dir_lock_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()
foreach(np 1 2 4)
  add_test(NAME test_stop_eval_np${np}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_stop_eval.sh $<TARGET_FILE:dtrain_cli> ${np} ${DT_MPIEXEC})
  set_tests_properties(test_stop_eval_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600)
endforeach()
set_tests_properties(test_stop_eval_np1 PROPERTIES LABELS unit)

# The sanitizer pass (ctest -LE slow) runs these at np 2 only: their np 4 twins
# exercise the same code under ASan for 20-55 s each; Release runs both. The
# collective watchdog's script runs in Release only (38 s under ASan); the
# watchdog's C code runs under ASan in test_dist_watchdog_* (a late rank
# named in the warning, poll and thread progress, np 2 and 4). So does
# test_output_paths (42 s under ASan): its checks (train/outputs.c) run under
# ASan in test_train_outputs and at the start of every CLI test's run.
# (The layer checks, shell scripts, are labelled so in CMakeLists.txt.) The 2 x 2
# simulated machines leave ASan to the uneven 3 + 1 layout, which runs the
# same hierarchical code with more edge cases; the hierarchical collectives
# run under ASan in both progress modes at np 4 (at np 2 only the topology is
# checked).
foreach(t test_freeze_np4 test_param_groups_np4 test_output_paths_np4 test_collective_watchdog_np4
          test_signal_stop_np4 test_collective_watchdog_np2 test_output_paths_np2
          test_pipeline_bitwise_np4 test_pipeline_faults_np4 test_config_agreement_np4
          test_stop_at_launch_np4 test_ckpt_dir_lock_np4
          test_zero_stage3_machines2x2_np4 test_zero_equivalence_machines2x2_np4
          test_zero_node_params_machines2x2_np4)
  if(NOT TEST ${t})
    message(FATAL_ERROR "cmake/tests.cmake: ${t} is not a test")
  endif()
  set_tests_properties(${t} PROPERTIES LABELS "mpi;slow")
endforeach()

# dtrain plot (issue 27 item 5): two tiny runs' --metrics and a 2-rank
# --trace drawn into one SVG, read back as XML (xmllint): every series' points
# are the JSONL's, every rank's split the trace's own sums; bad input refused.
add_test(NAME test_plot_cli
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_plot_cli.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_plot_cli PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300)
# dtrain plot on hand-made input, no training (a few seconds): odd bytes in
# file names, numbers past the axes' range; well-formed XML or one error line.
add_test(NAME test_plot_input
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_plot_input.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_plot_input PROPERTIES LABELS unit TIMEOUT 120)

# Re-executed to fix OpenBLAS's kernel family (forced: DTRAIN_TEST_BLAS_CORE),
# dtrain keeps its name: comm and `pgrep -x dtrain`, argv[0], and a link's
# name (issue 27). Skipped (77) on a CPU where no re-exec can happen.
add_test(NAME test_process_name
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_process_name.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_process_name PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)

# --precision bf16: matrix products of bf16-rounded inputs (fp32 accumulation):
# close to fp32, deterministic, DDP == ZeRO-2, checkpoints across precisions.
add_test(NAME test_precision
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_precision.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_precision PROPERTIES LABELS "mpi;slow" PROCESSORS 4 TIMEOUT 300)
# --param-dtype bf16|fp16: a 16-bit working copy of fp32 masters: every
# layout bitwise where fp32 is, checkpoints hold the masters across layouts.
add_test(NAME test_param_dtype
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_param_dtype.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_param_dtype PROPERTIES LABELS "mpi;slow" PROCESSORS 2 TIMEOUT 300)
add_test(NAME test_saved_activations
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_saved_activations.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_saved_activations PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300)

# --precision fp16 with dynamic loss scaling: overflowing steps skipped on
# every rank with the scale halving, then training; DDP / ZeRO-2 / --pp at 2
# ranks against one process, and a resume, bit for bit where fp32 is.
add_test(NAME test_fp16
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_fp16.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>)
set_tests_properties(test_fp16 PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300)

# --optim-state bf16 (issue 29): DDP == ZeRO-1/2/3 and --pp 2 == one process bit
# for bit as with fp32 state, resumes across storages, memory reports halved,
# W1-like convergence against fp32 state.
add_test(NAME test_optim_bf16
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_optim_bf16.sh $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:ckpt_cmp>
                 $<TARGET_FILE:ckpt_bf16>)
set_tests_properties(test_optim_bf16 PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 300)
add_test(NAME test_optim_bf16_converge
         COMMAND ${CMAKE_SOURCE_DIR}/tests/scripts/test_optim_bf16_converge.sh $<TARGET_FILE:dtrain_cli>)
set_tests_properties(test_optim_bf16_converge PROPERTIES LABELS slow TIMEOUT 600 SKIP_RETURN_CODE 77)

# Every test's MPI jobs use the ob1 PML (shared memory and TCP), the one that
# runs here anyway. Left to choose, Open MPI first opens the cm PML, whose
# psm2 MTL loads Debian's libpsm2; that library's start-up polls for
# Omni-Path adapters in 125 us sleeps, about 0.3-1 s per job on a machine
# without any (strace: ~1700 sleeps for a 2-rank job), and the suite starts
# several hundred jobs. Users keep Open MPI's choice (README: Troubleshooting).
get_property(DT_ALL_TESTS DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY TESTS)
foreach(t ${DT_ALL_TESTS})
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "OMPI_MCA_pml=ob1")
endforeach()

# test_att_tiles compares attention's tiles as this build compiles them with
# the kernels of builds without AVX-512 and without AVX (src/ops/att_tiles.h)
target_sources(test_att_tiles PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit/att_tiles_avx2.c
                                      ${CMAKE_SOURCE_DIR}/tests/unit/att_tiles_scalar.c)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|i.86")   # elsewhere all three are the portable kernel
  set_source_files_properties(${CMAKE_SOURCE_DIR}/tests/unit/att_tiles_avx2.c PROPERTIES COMPILE_OPTIONS "-mno-avx512f")
  set_source_files_properties(${CMAKE_SOURCE_DIR}/tests/unit/att_tiles_scalar.c PROPERTIES COMPILE_OPTIONS "-mno-avx")
endif()
