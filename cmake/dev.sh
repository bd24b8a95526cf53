#!/usr/bin/env bash
# carve's developer entry points. Each first installs what a fresh Debian 12 machine with the
# CUDA Toolkit lacks (apt-get, as root or through sudo), then builds under build/ and runs.
#
#   bash cmake/dev.sh demo    build and run the examples, then the workgroup scheduling simulator
#                             on its built-in default (results in build/slot_sim_out/) and
#                             carve_replay on a real PyTorch memory snapshot
#   bash cmake/dev.sh test    the whole test suite: g++ with warnings as errors (plus every .cu
#                             through nvcc's front end to PTX for sm_80 when nvcc is present),
#                             clang++ under AddressSanitizer + UndefinedBehaviorSanitizer,
#                             the tests labelled `concurrent` under ThreadSanitizer, the
#                             libFuzzer targets for a short run each, `pip install .` into a
#                             fresh virtual environment with the host tests run against the
#                             installed carve_gpu, the API reference with
#                             Doxygen (warnings are errors), and a clang-format check;
#                             each stage's time is printed at the end
#   bash cmake/dev.sh bench   optimised benchmarks, printed side by side with their baselines
#   bash cmake/dev.sh device-build  after `test` (CI runs it): every .cu of its g++ build compiled
#                             to machine code for sm_80 and sm_90 (ptxas's spill and stack-frame
#                             checks), the layout check for both, and the compile time of a .cu
#                             that includes each umbrella header
#   bash cmake/dev.sh bench-smoke   after `test` (CI runs it): every benchmark built in its g++
#                             build (GPU ones compiled for sm_80 and sm_90) and run once, briefly
#   bash cmake/dev.sh gpu     on a machine with a GPU: every gpu-labelled test and GPU benchmark,
#                             reported in build/gpu/gpu-report.md and .csv (without one: builds)
#   bash cmake/dev.sh docs    the API reference (Doxygen) in build/docs/html; fails on any
#                             warning, an undocumented public name among them (the test command
#                             builds it too)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)
packages=(cmake ninja-build g++ clang libclang-rt-14-dev clang-format doctest-dev libfmt-dev libbenchmark-dev libnuma-dev
  libconcurrentqueue-dev libboost-dev liburing-dev doxygen python3 python3-dev python3-venv python3-torch libtorch-dev pybind11-dev)

say() { printf '\n== %s\n' "$*"; }

install_missing() { # install_missing [package...]: the given packages, or all of `packages`
  local missing=() wanted=("$@")
  [ ${#wanted[@]} -eq 0 ] && wanted=("${packages[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  # Short network timeouts: a machine without a registry (a lent GPU's) must not wait out the defaults.
  local quick=(-o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20 -o Acquire::Retries=1)
  "${sudo[@]}" apt-get "${quick[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get "${quick[@]}" install -y -qq --no-install-recommends "${missing[@]}"
}

# nvcc is used when it can be found; the toolkit's usual home need not be on PATH.
find_nvcc() {
  if ! command -v nvcc >/dev/null && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
}

build() { # build <dir> <cmake args...>
  local dir=$1
  shift
  cmake -S "$root" -B "$root/build/$dir" -G Ninja "$@" >/dev/null
  cmake --build "$root/build/$dir" -j "$jobs"
}

run_tests() { # run_tests <dir> [ctest args...]
  local dir=$1
  shift
  ctest --test-dir "$root/build/$dir" -j "$jobs" --output-on-failure "$@"
}

demo() {
  build demo -DCMAKE_BUILD_TYPE=Release -DCARVE_ENABLE_CUDA=OFF -DCARVE_BUILD_TESTS=OFF -DCARVE_BUILD_BENCHMARKS=OFF
  cmake --build "$root/build/demo" --target run_examples
  say "slot_sim: the workgroup-queue experiment, 200 seeds x every policy"
  (cd "$root" && build/demo/examples/slot_sim --out build/slot_sim_out)
  # A real model's allocations through carve's pools beside PyTorch's allocator: the shared
  # snapshot where it is beside the repository, else the tests' own.
  local trace="$root/../shared/traces/tinyllama_1.1b_lora_step.pickle"
  [ -f "$trace" ] || trace="$root/tests/data/traces/small_snapshot.pickle"
  say "carve_replay: $(basename "$trace") through every pool (plot in build/replay.svg)"
  "$root/build/demo/examples/carve_replay" "$trace" --svg "$root/build/replay.svg"
}

format_check() {
  (cd "$root" && git ls-files --cached --others --exclude-standard '*.hpp' '*.cpp' '*.cu' '*.cuh' |
    xargs clang-format --dry-run --Werror)
}

# Each libFuzzer target runs for 12 s (CARVE_FUZZ_SECONDS) from the shipped test data (a scratch copy, so
# the corpus it grows stays out of the tree); a crash fails the test command.
fuzz_run() { # fuzz_run <target> <seed files...>
  local target=$1 corpus log
  shift
  corpus=$(mktemp -d)
  log=$(mktemp)
  cp "$@" "$corpus"/
  if ! "$root/build/asan/tests/fuzz/$target" -max_total_time="${CARVE_FUZZ_SECONDS:-12}" -max_len=4096 -timeout=10 \
    -print_final_stats=1 "$corpus" >"$log" 2>&1; then
    cat "$log"
    return 1
  fi
  echo "$target:"
  grep -E "^Done|stat::number_of_executed_units" "$log"
  rm -rf "$corpus" "$log"
}

# The fuzzers are built in the ASan stage (at -O1 whatever its flags: tests/fuzz/CMakeLists.txt).
fuzz_check() {
  # The three run side by side, one process each.
  local topology protocol pickle status=0
  fuzz_run fuzz_topology "$root"/tests/data/topology/*.txt &
  topology=$!
  fuzz_run fuzz_service_protocol "$root"/tests/data/service/*.bin &
  protocol=$!
  fuzz_run fuzz_pickle "$root"/tests/data/pickle/*.pickle &
  pickle=$!
  wait "$topology" || status=1
  wait "$protocol" || status=1
  wait "$pickle" || status=1
  return "$status"
}

# stage <title> <function>: runs one stage of the test command and records how long it took.
stage_times=()
stage() {
  local title=$1 start=$SECONDS
  shift
  say "$title"
  "$@"
  stage_times+=("$(printf '%5d s  %s' $((SECONDS - start)) "$title")")
}

# -Og with assertions on: g++'s flow analyses (the uninitialised-value warnings) at about the
# cost of an unoptimised build; -O2 would add a third to the stage for a few more warnings about
# bounds, which the sanitizer stages check at run time.
#
# Device code goes through nvcc's front end only, to PTX for sm_80 (`80-virtual`): every C++ error
# and warning in a kernel, at a quarter of what machine code for two architectures costs (ptxas is
# most of a .cu's compile time). Nothing here runs device code, and ptxas's own checks (spills,
# stack frames) and sm_90 are `device_build`'s, which CI runs next.
gxx_config=(-DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-Og -DCMAKE_CXX_COMPILER=g++ -DCARVE_WERROR=ON)
machine_code="-DCMAKE_CUDA_ARCHITECTURES=80;90" # what CI builds device code for
gxx_stage() {
  build gxx "${gxx_config[@]}" -DCARVE_BUILD_BENCHMARKS=OFF -DCARVE_BUILD_GPU_BENCHMARKS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=80-virtual
  run_tests gxx
}

# What the test command leaves to CI: the g++ build's .cu files as machine code for sm_80 and
# sm_90, where ptxas fails a kernel that spills registers or whose stack passes
# CARVE_KERNEL_FRAME_LIMIT; tests/umbrella/everything.cu, every carve component in one .cu; the
# layout check against both architectures' PTX; and what including carve costs a .cu.
device_build() {
  find_nvcc
  build gxx "${gxx_config[@]}" "$machine_code"
  if ! grep -q "^CARVE_ENABLE_CUDA:BOOL=ON" "$root/build/gxx/CMakeCache.txt"; then
    if [ -n "${CARVE_CI:-}" ]; then # .ci/run: CI's machines have nvcc, and without it the layouts go unproven
      echo "CI: no nvcc, so no device code built and no device_layouts check: failing" >&2
      return 1
    fi
    echo "no nvcc: no device code to build"
    return
  fi
  cmake --build "$root/build/gxx" -j "$jobs" --target carve_umbrella_everything
  run_tests gxx -R '^device_layouts$' --no-tests=error
  say "nvcc: what a .cu that includes carve's umbrella headers takes to compile"
  umbrella_compile_time
}

# Benchmarks are not tests, so the test command leaves them out; CI then builds every one into the
# test command's g++ build (the GPU ones for sm_80 and sm_90, compiled only: no GPU there) and
# runs each host benchmark once, briefly, which also checks that its implementations agree
# before it times them (label `benchmark`). Real numbers come from `bench`.
bench_smoke() {
  find_nvcc
  build gxx "${gxx_config[@]}" -DCARVE_BUILD_BENCHMARKS=ON -DCARVE_BUILD_GPU_BENCHMARKS=ON "$machine_code"
  run_tests gxx -L benchmark
}

# What including carve costs a .cu. First examples/compose_block_scratch.cu (includes
# <carve/carve.hpp>, uses carve's allocators in a kernel) as device_build built it: nvcc,
# both architectures in one invocation, from Ninja's log. Then each umbrella header with one empty
# kernel, once per architecture (tests/umbrella): their compile commands are taken from that
# build and run here, $jobs at a time, timed (wall, and the CPU time nvcc and its passes used, which
# other work on the machine inflates less); a command that fails fails the stage. The aim: at most
# 5 s per architecture for the device-side umbrellas (slot, mr, queue).
umbrella_compile_time() {
  local dir="$root/build/gxx"
  local object=examples/CMakeFiles/compose_block_scratch.dir/compose_block_scratch.cu.o
  if ! grep -q "$object" "$dir/.ninja_log" 2>/dev/null; then
    echo "no nvcc build: nothing to report"
    return
  fi
  awk -v o="$object" '$4 == o {ms = $2 - $1} END {printf "examples/compose_block_scratch.cu (includes <carve/carve.hpp>, carve allocators in a kernel): %.1f s for sm_80 and sm_90\n", ms / 1000}' "$dir/.ninja_log"

  local objects work timed=() failed=0 umbrella name
  # The four umbrellas only: everything.cu (CARVE_CUDA_FULL_UMBRELLAS) is built, untimed, above.
  objects=$(ninja -C "$dir" -t targets all |
    sed -nE 's#^(tests/umbrella/CMakeFiles/carve_umbrella_(carve|slot|mr|queue)\.dir/[a-z]+\.cu\.o):.*#\1#p')
  work=$(mktemp -d)
  for o in $objects; do
    local name
    name=$(basename "$(dirname "$o")" .dir)
    timed+=("$name")
    mkdir -p "$dir/$(dirname "$o")"
    ninja -C "$dir" -t commands "$o" | tail -n 1 >"$work/$name"
  done
  if [ ${#timed[@]} -eq 0 ]; then
    echo "no tests/umbrella objects in the g++ build: nothing more to report"
    rm -rf "$work"
    return
  fi
  # One compile per process; bash's `time` counts the CPU time of nvcc's passes too.
  # shellcheck disable=SC2016 # expanded by the inner shell
  printf '%s\n' "${timed[@]}" | xargs -P "$jobs" -I{} bash -c 'cd "$1" && TIMEFORMAT="%R %U %S" && { time bash "$2/$3" >"$2/$3.log" 2>&1; } 2>"$2/$3.time" || echo failed >>"$2/$3.time"' _ "$dir" "$work" {}
  local archs
  archs=$(grep -o 'arch=compute_[0-9]*' "$work/${timed[0]}" | wc -l)
  [ "$archs" -gt 0 ] || archs=1
  printf '%-24s %6s %8s %8s  (%s architectures in one nvcc call)\n' ".cu, one empty kernel" "wall" "CPU" "CPU/arch" "$archs"
  for umbrella in carve slot mr queue; do
    name=carve_umbrella_$umbrella
    [ -f "$work/$name.time" ] || continue
    if grep -q failed "$work/$name.time"; then
      printf '%-24s FAILED to compile:\n' "<carve/$umbrella.hpp>"
      cat "$work/$name.log"
      failed=1
    else
      awk -v u="<carve/$umbrella.hpp>" -v n="$archs" 'NR == 1 {printf "%-24s %4.1f s %6.1f s %6.1f s\n", u, $1, $2 + $3, ($2 + $3) / n}' "$work/$name.time"
    fi
  done
  rm -rf "$work"
  return $failed
}

# Unoptimised: clang takes three times as long to instrument optimised code, and the tests run
# fast enough without. The examples' command-line tests run in the g++ stage.
asan_stage() {
  local sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O0 -gline-tables-only"
  build asan -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_COMPILER=clang++ -DCARVE_WERROR=ON -DCARVE_ENABLE_CUDA=OFF \
    -DCARVE_BUILD_BENCHMARKS=OFF -DCARVE_BUILD_EXAMPLES=OFF -DCARVE_BUILD_FUZZERS=ON -DCMAKE_CXX_FLAGS="$sanitize" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
  # The packaging tests (a consumer project built two ways) say nothing new under sanitizers.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 run_tests asan -LE packaging
}

# Only the tests labelled `concurrent` run under ThreadSanitizer, so only they are built. At -O0:
# every access the source makes is instrumented (none optimised away), and the stage takes a
# quarter less than at -O1 (measured: 61 s to build and 30 s to run, against 106 s and 17 s).
tsan_stage() {
  cmake -S "$root" -B "$root/build/tsan" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_COMPILER=clang++ \
    -DCARVE_WERROR=ON -DCARVE_ENABLE_CUDA=OFF -DCARVE_BUILD_BENCHMARKS=OFF -DCARVE_BUILD_EXAMPLES=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -O0 -gline-tables-only" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  # carve_thread_tests: the executables that hold them (tests/CMakeLists.txt).
  cmake --build "$root/build/tsan" -j "$jobs" --target carve_thread_tests
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --test-dir "$root/build/tsan" -L concurrent -j "$jobs" \
    --output-on-failure
}

# `pip install .` as a PyTorch user runs it: into a fresh virtual environment of the Python that has
# PyTorch (Debian's python3-torch here, seen through --system-site-packages), without build
# isolation, so libcarve_torch_oom is built against that PyTorch's c10. Then the host tests of
# test_carve_torch.py against the installed package and libraries, from outside the checkout.
package_stage() {
  local python=python3 venv="$root/build/venv"
  if /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then
    python=/usr/bin/python3
  fi
  rm -rf "$venv"
  "$python" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install --no-build-isolation --no-deps --no-index --quiet "$root"
  rm -rf "$root/python/carve_gpu.egg-info"
  local installed
  installed=$("$venv/bin/python" -c "import carve_gpu, os; print(os.path.dirname(carve_gpu.__file__))")
  ls "$installed"/*.so
  (cd "$venv" && CARVE_GPU_INSTALLED=1 "$venv/bin/python" "$root/tests/torch/test_carve_torch.py" \
    "$installed/libcarve_torch.so" "$root")
}

tests() {
  find_nvcc
  local start=$SECONDS
  stage "g++ -Og, warnings as errors (device code through nvcc to PTX for sm_80 if present)" gxx_stage
  stage "clang++, AddressSanitizer + UndefinedBehaviorSanitizer" asan_stage
  stage "clang++, ThreadSanitizer (tests labelled concurrent)" tsan_stage
  stage "clang++ libFuzzer (ASan + UBSan)" fuzz_check
  stage "pip install . into a fresh virtual environment, host tests against the installed package" package_stage
  stage "Doxygen API reference (warnings are errors)" docs
  stage "clang-format" format_check
  say "stage times"
  printf '%s\n' "${stage_times[@]}"
  printf '%5d s  in all\n' $((SECONDS - start))
}

# Doxygen 1.9 says nothing about an undocumented concept, so every concept outside a detail
# namespace in the folders the Doxyfile covers must follow a /// comment.
undocumented_concepts() {
  local dirs
  dirs=$(awk '/^INPUT[ ]*=/ {on = 1; sub(/^INPUT[ ]*=/, "")}
              on {more = /\\[ ]*$/; sub(/\\[ ]*$/, ""); print; if (!more) on = 0}' "$root/Doxyfile")
  # shellcheck disable=SC2086 # one folder per word
  (cd "$root" && find $dirs -name '*.hpp' -o -name '*.cuh' | sort | xargs awk '
    FNR == 1 {detail = 0; prev = ""}
    /namespace [A-Za-z_:]*detail \{/ {detail = 1}
    /^} \/\/ namespace [A-Za-z_:]*detail/ {detail = 0}
    /^(template|requires) / {next}
    /^concept [A-Za-z_]+/ && !detail && prev !~ /^[ ]*\/\/\// {print FILENAME ":" FNR ": concept " $2 " is not documented"; bad = 1}
    {prev = $0}
    END {exit bad}')
}

# WARN_AS_ERROR=FAIL_ON_WARNINGS in the Doxyfile: Doxygen prints every warning, finishes the
# reference, then exits non-zero if there was any.
docs() {
  local start=$SECONDS
  mkdir -p "$root/build/docs"
  (cd "$root" && doxygen Doxyfile)
  undocumented_concepts
  echo "API reference in build/docs/html/index.html ($((SECONDS - start)) s)"
}

# A GPU benchmark's target lines (benchmarks/gpu_targets.hpp:
#   <name>: <number> <unit> (target <op> <value> <unit>, source: <text>) met|MISSED)
# as tab-separated fields: program, name, number, unit, target, source, result.
target_fields() { # target_fields <program> < output
  sed -nE "s/^([^:]+): ([^ ]+) ([^ ]+) \(target (<=|>=) ([^ ]+) [^,]*, source: (.*)\) (met|MISSED)\$/$1\t\1\t\2\t\3\t\4 \5\t\6\t\7/p"
}

# Everything that needs a GPU, on a machine with one: builds what it runs (target carve_gpu_checks)
# for the local GPU's architecture, runs every test labelled `gpu` (under compute-sanitizer's
# memcheck and racecheck too, when the tool is there), every GPU benchmark (bench_gpu_*) and the
# PyTorch checks of tests/torch, and writes gpu-report.md and gpu-report.csv: the devices, driver
# and toolkit, each test's result and each benchmark target's number beside its target and source,
# met or missed. Without a GPU it builds everything for sm_80 and sm_90, says so and exits 0.
#
# A GPU is often lent for minutes, so the report is written as it goes, and:
#   CARVE_GPU_REPORT_DIR    where the report, the CSV and each PyTorch check's full output go
#                           (default build/gpu): somewhere kept if the run is cut short
#   CARVE_GPU_PARTS         which parts run (default: tests bench torch sanitizers; torch is the
#                           PyTorch checks oom, graphs, devices and training, also named alone);
#                           they run in that order whatever order the variable names them in
#   CARVE_GPU_SCRIPT_SECONDS        bound on each PyTorch check (default 600)
#   CARVE_GPU_TRAINING_MODELS       the training check's models (default gpt2,resnet50,varlen)
#   CARVE_GPU_SANITIZERS, CARVE_GPU_SANITIZER_SECONDS   see the sanitizers part below
gpu_part() { # gpu_part <name>: whether CARVE_GPU_PARTS asks for it (`torch` is oom, graphs, devices and training)
  local parts=" ${CARVE_GPU_PARTS-tests bench torch sanitizers} " # set but empty: none
  parts=${parts/ torch / torch oom graphs devices training }
  [[ $parts == *" $1 "* ]]
}

# torch_check <name> <script> [args...]: one of tests/torch's GPU scripts, which appends its own
# section to the report; its whole output is kept beside the report, and its last lines go into the
# report when it fails before writing its section.
torch_check() {
  local name=$1 script=$2 result=passed code=0 before
  shift 2
  before=$(wc -c <"$report")
  timeout "${CARVE_GPU_SCRIPT_SECONDS:-600}" python3 "$root/tests/torch/$script" "$@" >"$report_dir/$name.log" 2>&1 ||
    code=$?
  if [ "$code" -eq 77 ]; then # the script could not run here (gpu_devices.py with one GPU)
    result=skipped
  elif [ "$code" -ne 0 ]; then
    result=FAILED
    [ "$code" -eq 124 ] && result="FAILED (timed out)"
    printf '\n%s: %s (exit %s; its whole output is %s.log beside this report)\n' "$name" "$result" "$code" \
      "$name" >>"$report"
    if [ "$(wc -c <"$report")" -le $((before + 200)) ]; then # it ended before writing its section
      printf '\n```\n%s\n```\n' "$(tail -n 30 "$report_dir/$name.log")" >>"$report"
    fi
  fi
  echo "test,,$name,,,,,$result" >>"$csv"
}

gpu() {
  find_nvcc
  local nvcc=${CUDACXX:-$(command -v nvcc || true)}
  if [ -z "$nvcc" ]; then
    echo "dev.sh gpu: no nvcc (set CUDACXX or put the CUDA toolkit's bin on PATH)" >&2
    exit 1
  fi
  local arch="" devices=0 names="none" driver="none"
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
    devices=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
    names=$(nvidia-smi --query-gpu=index,name --format=csv,noheader | sed 's/^\([0-9]*\), /GPU\1 /' | paste -sd ';' |
      sed 's/;/; /g')
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
  fi
  local dir="$root/build/gpu" toolkit
  toolkit=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  # Seen by the parts below (bash's locals reach the functions a function calls).
  local report_dir=${CARVE_GPU_REPORT_DIR:-$dir} report csv
  report_dir=$(mkdir -p "$report_dir" && cd "$report_dir" && pwd)
  report="$report_dir/gpu-report.md"
  csv="$report_dir/gpu-report.csv"
  {
    echo "# carve on a GPU"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'); devices: $devices ($names); driver: $driver; CUDA toolkit: $toolkit;" \
      "built for: ${arch:-80;90}; host compiler: $(${CXX:-c++} --version | head -n 1)"
    echo
  } >"$report"
  echo "kind,program,name,value,unit,target,source,result" >"$csv"
  # The build's output goes beside the report; its end goes into the report if it fails. With a
  # GPU, only what the run uses (target carve_gpu_checks); without, all of it.
  local only=()
  [ -n "$arch" ] && only=(--target carve_gpu_checks)
  if ! { cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARVE_ENABLE_CUDA=ON \
    -DCARVE_BUILD_GPU_BENCHMARKS=ON "-DCMAKE_CUDA_ARCHITECTURES=${arch:-80;90}" &&
    cmake --build "$dir" -j "$jobs" "${only[@]}"; } >"$report_dir/build.log" 2>&1; then
    printf 'The build failed; the end of build.log:\n\n```\n%s\n```\n' "$(tail -n 40 "$report_dir/build.log")" >>"$report"
    cat "$report"
    return 1
  fi
  if [ -z "$arch" ]; then
    {
      echo "No GPU here: every GPU test and benchmark was built for sm_80 and sm_90; nothing ran."
      echo "Benchmarks built: $(find "$dir/benchmarks" -maxdepth 1 -name 'bench_gpu_*' -type f -printf '%f\n' |
        sort | paste -sd ' ')"
    } >>"$report"
    cat "$report"
    return 0
  fi
  # The parts, in order: each gpu test once, its output kept in the report; the benchmarks; the
  # PyTorch checks; then, while the tests are known to pass, compute-sanitizer over each test
  # (slower by far: last, so that a lease that ends early still has the results).
  local t tests=() exes=()
  while read -r t; do
    tests+=("$t")
    exes+=("$(ctest --test-dir "$dir" -N -V -R "^${t}\$" | sed -n 's/.*Test command: \([^ ]*\).*/\1/p')")
  done < <(ctest --test-dir "$dir" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p')
  gpu_part tests && gpu_tests
  gpu_part bench && gpu_benchmarks
  gpu_part oom || gpu_part graphs || gpu_part devices || gpu_part training && gpu_torch
  gpu_part sanitizers && gpu_sanitizers
  cat "$report"
}

gpu_tests() {
  echo "## Tests" >>"$report"
  local t
  for t in "${tests[@]}"; do
    local log code=0 result=passed
    log=$(mktemp)
    ctest --test-dir "$dir" -R "^${t}\$" -V --timeout 300 >"$log" 2>&1 || code=$?
    # Every gpu test skips only without a usable device, and nvidia-smi listed one: a skip here
    # (a driver too old for the toolkit, say) is a failure, with the reason in its output.
    if grep -qE "^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped" "$log"; then
      result="FAILED (skipped although nvidia-smi lists a GPU)"
    elif grep -qE "^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*(Not Run|Disabled)" "$log"; then
      result="FAILED (not run: its program is missing)"
    elif [ "$code" -ne 0 ] || ! grep -q "Passed" "$log"; then
      result="FAILED"
    fi
    {
      echo "- $t: $result"
      echo
      echo '  ```'
      # A test that crashed may have printed nothing of its own: grep then matches nothing.
      sed -n 's/^[0-9]*: //p' "$log" |
        { grep -v '^Test command:\|^Working Directory:\|^Test timeout\|^Environment variables' || true; } |
        tail -n 40 | sed 's/^/  /'
      echo '  ```'
    } >>"$report"
    echo "test,,$t,,,,,$result" >>"$csv"
    rm -f "$log"
  done
  echo >>"$report"
}

gpu_benchmarks() {
  echo "## Benchmarks" >>"$report"
  local b name output code targets="$report_dir/gpu-targets.tsv"
  : >"$targets"
  for b in "$dir"/benchmarks/bench_gpu_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    output=$(mktemp)
    code=0
    # Each ends within a minute or two by its own limits; the timeout is the backstop (124: FAILED).
    timeout "${CARVE_GPU_BENCH_SECONDS:-300}" "$b" >"$output" 2>&1 || code=$?
    {
      echo "### $name"
      echo '```'
      cat "$output"
      echo '```'
    } >>"$report"
    target_fields "$name" <"$output" >>"$targets"
    case "$code" in
    0) ;;
    77) echo "bench,$name,exit status,77,,,,FAILED (skipped although nvidia-smi lists a GPU)" >>"$csv" ;;
    *) echo "bench,$name,exit status,$code,,,,FAILED" >>"$csv" ;;
    esac
    rm -f "$output"
  done
  # The CSV quotes its text fields; the report gets the same rows as a table.
  awk -F '\t' 'function q(s) { gsub(/"/, "\"\"", s); return "\"" s "\"" }
    { print "bench," $1 "," q($2) "," $3 "," q($4) "," q($5) "," q($6) "," $7 }' "$targets" >>"$csv"
  {
    echo
    echo "## Targets: $(grep -c $'\tmet$' "$targets" || true) met, $(grep -c $'\tMISSED$' "$targets" || true) missed"
    echo
    echo "| program | target | number | aim | source | result |"
    echo "| --- | --- | ---: | --- | --- | --- |"
    awk -F '\t' '{ gsub(/\|/, "\\|"); print "| " $1 " | " $2 " | " $3 " " $4 " | " $5 " " $4 " | " $6 " | " $7 " |" }' "$targets"
  } >>"$report"
}

# libcarve_torch under PyTorch, wherever PyTorch imports: carve's refusals (torch.OutOfMemoryError,
# nothing released under a running kernel) first, as the quickest; CUDA graphs (a captured
# training step and torch.compile(mode="reduce-overhead") under each pool, against PyTorch's
# allocator); tensors copied between two GPUs (skipped with one); a real training step under PyTorch's two allocators and carve's, where transformers
# and timm are installed too. Each script appends its section to the report.
gpu_torch() {
  printf '\n## PyTorch through libcarve_torch\n' >>"$report"
  if ! python3 -c "import torch" >/dev/null 2>&1; then
    printf '\nskipped: python3 cannot import torch here\n' >>"$report"
    return
  fi
  local library="$dir/src/torch/libcarve_torch.so"
  gpu_part oom && torch_check gpu_out_of_memory gpu_out_of_memory.py --library "$library" --report "$report"
  gpu_part graphs && torch_check gpu_graphs gpu_graphs.py --library "$library" --report "$report"
  gpu_part devices && torch_check gpu_devices gpu_devices.py --library "$library" --report "$report"
  gpu_part training || return 0
  if python3 -c "import transformers, timm" >/dev/null 2>&1; then
    # carve_replay is built where fmt is found; without it the prediction is left out, said so.
    local replay=()
    if [ -x "$dir/examples/carve_replay" ]; then
      replay=(--replay "$dir/examples/carve_replay")
    else
      printf '\nno carve_replay in the build (fmt not found): no predictions\n' >>"$report"
    fi
    torch_check gpu_training_step gpu_training_step.py --library "$library" "${replay[@]}" --report "$report" \
      --keep-snapshots "$report_dir" --models "${CARVE_GPU_TRAINING_MODELS:-gpt2,resnet50,varlen}"
  else
    printf '\nskipped gpu_training_step: python3 cannot import transformers and timm here\n' >>"$report"
  fi
}

# compute-sanitizer over each gpu test: CARVE_GPU_SANITIZERS names the tools (default memcheck and
# racecheck; empty for none), CARVE_GPU_SANITIZER_SECONDS bounds each run (default 300).
gpu_sanitizers() {
  local sanitizer tool i
  sanitizer=$(command -v compute-sanitizer || true)
  [ -n "${CARVE_GPU_SANITIZERS-memcheck racecheck}" ] || return 0
  printf '\n## compute-sanitizer\n\n' >>"$report"
  if [ -z "$sanitizer" ]; then
    printf 'skipped: compute-sanitizer is not on PATH\n' >>"$report"
    return 0
  fi
  for tool in ${CARVE_GPU_SANITIZERS-memcheck racecheck}; do
    for i in "${!tests[@]}"; do
      [ -x "${exes[$i]}" ] || continue
      local code=0 result=clean log="$report_dir/$tool-${tests[$i]//\//_}.log" quiet=()
      # The tests provoke API errors on purpose and check them (a full card's refusals, an
      # unmap the driver must refuse): memcheck counts memory errors only.
      [ "$tool" = memcheck ] && quiet=(--report-api-errors no)
      CARVE_COMPUTE_SANITIZER=$tool timeout "${CARVE_GPU_SANITIZER_SECONDS:-300}" "$sanitizer" --tool "$tool" \
        "${quiet[@]}" --error-exitcode 1 \
        "${exes[$i]}" >"$log" 2>&1 || code=$?
      case "$code" in
      0 | 77) ;;
      124) result="timed out" ;;
      *) result=FAILED ;;
      esac
      echo "- ${tests[$i]}, $tool: $result" >>"$report"
      if [ "$result" = clean ]; then
        rm -f "$log"
      else # what the tool found, its end here and all of it beside the report
        printf '\n  ```\n%s\n  ```\n' "$(tail -n 20 "$log" | sed 's/^/  /')" >>"$report"
      fi
      echo "sanitizer,$tool,${tests[$i]},,,,,$result" >>"$csv"
    done
  done
}

bench() {
  build bench -DCMAKE_BUILD_TYPE=Release -DCARVE_ENABLE_CUDA=OFF -DCARVE_BUILD_TESTS=OFF -DCARVE_BUILD_EXAMPLES=OFF
  for b in "$root"/build/bench/benchmarks/bench_*; do
    say "$(basename "$b")"
    "$b" "$@"
  done
}

command=${1:-}
shift || true
case "$command" in
demo) install_missing && demo ;;
test) install_missing && tests ;;
bench) install_missing && bench "$@" ;;
docs) install_missing && docs ;;
device-build) install_missing && device_build ;;
bench-smoke) install_missing && bench_smoke ;;
gpu)
  # A GPU machine may have no network: build with what it has when the packages cannot be installed.
  install_missing cmake ninja-build g++ doctest-dev libfmt-dev libbenchmark-dev python3 ||
    say "could not install every package (no network?); building with what is here"
  gpu
  ;;
*)
  echo "usage: bash cmake/dev.sh demo|test|bench|device-build|bench-smoke|docs|gpu [benchmark flags]" >&2
  exit 2
  ;;
esac
