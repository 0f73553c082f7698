# The Blackwell (sm_100a) kernels: CUTLASS 4.x block-scaled GEMM + amax epilogue.
# include()d by cmake/cuda_backend.cmake when "100a" is in JAX_GEMM_AMAX_CUDA_ARCHS (after
# enable_language(CUDA), find_package(CUDAToolkit) and with Python_EXECUTABLE found).
# Defines the static library target jga_cuda_sm100.
#
# CUTLASS is header-only here: its headers come from the `nvidia-cutlass` Python package
# (cutlass_library/source/include and cutlass_library/source/tools/util/include), a build
# requirement in pyproject.toml. The package is located with the build's Python interpreter
# (PYTHONPATH and the build environment are respected: the child process inherits them) without
# importing it. -DJGA_CUTLASS_DIR=<CUTLASS source tree> overrides the lookup.

set(JGA_CUTLASS_MIN_VERSION 4.2)

if(JGA_CUTLASS_DIR)
  set(JGA_CUTLASS_INCLUDE_DIRS "${JGA_CUTLASS_DIR}/include" "${JGA_CUTLASS_DIR}/tools/util/include")
else()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.util, os, sys
spec = importlib.util.find_spec("cutlass_library")
if spec is None or not spec.submodule_search_locations:
    sys.exit("the Python package cutlass_library (from the nvidia-cutlass wheel) is not importable")
source = os.path.join(list(spec.submodule_search_locations)[0], "source")
include = os.path.join(source, "include")
util = os.path.join(source, "tools", "util", "include")
if not os.path.isfile(os.path.join(include, "cutlass", "cutlass.h")):
    sys.exit("cutlass_library has no C++ headers under " + include)
print(include)
print(util)
]=]
    RESULT_VARIABLE _jga_cutlass_rc
    OUTPUT_VARIABLE _jga_cutlass_out
    ERROR_VARIABLE _jga_cutlass_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _jga_cutlass_rc EQUAL 0)
    message(FATAL_ERROR
      "jax_gemm_amax: the sm_100a kernels need the CUTLASS C++ headers from the `nvidia-cutlass` Python package "
      "(pip install --no-deps 'nvidia-cutlass>=${JGA_CUTLASS_MIN_VERSION}'), looked up with ${Python_EXECUTABLE}: "
      "${_jga_cutlass_err}${_jga_cutlass_out}\n"
      "Install it into the build environment, pass -DJGA_CUTLASS_DIR=<CUTLASS source tree>, or build without "
      "the Blackwell kernels (-DJAX_GEMM_AMAX_CUDA_ARCHS=90a).")
  endif()
  string(REPLACE "\n" ";" JGA_CUTLASS_INCLUDE_DIRS "${_jga_cutlass_out}")
endif()

list(GET JGA_CUTLASS_INCLUDE_DIRS 0 _jga_cutlass_include)
if(NOT EXISTS "${_jga_cutlass_include}/cutlass/version.h")
  message(FATAL_ERROR "jax_gemm_amax: no CUTLASS headers at ${_jga_cutlass_include} (cutlass/version.h is missing)")
endif()
file(STRINGS "${_jga_cutlass_include}/cutlass/version.h" _jga_cutlass_version_lines
     REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) [0-9]+")
foreach(_line IN LISTS _jga_cutlass_version_lines)
  if(_line MATCHES "^#define CUTLASS_(MAJOR|MINOR|PATCH) ([0-9]+)")
    set(_jga_cutlass_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  endif()
endforeach()
set(JGA_CUTLASS_VERSION "${_jga_cutlass_MAJOR}.${_jga_cutlass_MINOR}.${_jga_cutlass_PATCH}")
if(JGA_CUTLASS_VERSION VERSION_LESS JGA_CUTLASS_MIN_VERSION)
  message(FATAL_ERROR "jax_gemm_amax: the sm_100a kernels need CUTLASS >= ${JGA_CUTLASS_MIN_VERSION}; found "
                      "${JGA_CUTLASS_VERSION} at ${_jga_cutlass_include}")
endif()
if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.8)
  message(FATAL_ERROR "jax_gemm_amax: the sm_100a kernels need nvcc >= 12.8; found ${CMAKE_CUDA_COMPILER_VERSION}")
endif()
message(STATUS "jax_gemm_amax: sm_100a kernels with CUTLASS ${JGA_CUTLASS_VERSION} from ${_jga_cutlass_include}")

# One translation unit per kernel configuration (see ffi/cuda/sm100/sm100_dispatch.cu for the set)
# plus the dispatcher; each kernel TU takes 30-55 s and up to ~4.6 GB of compiler memory.
file(GLOB JGA_SM100_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/sm100/*.cu)
add_library(jga_cuda_sm100 STATIC ${JGA_SM100_SOURCES})
# sm_100a SASS plus its PTX (tests/test_sm100_build.py inspects both with cuobjdump).
# CUTLASS defines CUTLASS_ARCH_MMA_SM100_SUPPORTED / CUTLASS_ARCH_MMA_SM100A_ENABLED itself from
# nvcc >= 12.8 and __CUDA_ARCH_FEAT_SM100_ALL, which compute_100a sets.
set_target_properties(jga_cuda_sm100 PROPERTIES CUDA_ARCHITECTURES 100a)
target_include_directories(jga_cuda_sm100 SYSTEM PRIVATE ${JGA_CUTLASS_INCLUDE_DIRS})
# CUTLASS_SKIP_REDUCTION_INIT: the amax reset is our cudaMemsetAsync; CUTLASS's would call the
# driver API (cuMemsetD32Async) and the extension must not need libcuda to be imported.
target_compile_definitions(jga_cuda_sm100 PRIVATE CUTLASS_SKIP_REDUCTION_INIT=1)
target_compile_options(jga_cuda_sm100 PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
# CUTLASS reaches the driver only through cudaGetDriverEntryPoint (TMA descriptors): no -lcuda.
target_link_libraries(jga_cuda_sm100 PUBLIC jga_core CUDA::cudart_static)
