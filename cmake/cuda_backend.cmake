# The CUDA backend: the FFI handlers plus one static library of GEMM kernels per architecture, each
# compiled only for its own arch (sm_90a kernels use wgmma, sm_100a ones tcgen05), and the
# arch-neutral quantize kernels, compiled for every arch in JAX_GEMM_AMAX_CUDA_ARCHS.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

set(JGA_CUDA_FLAGS --expt-relaxed-constexpr -lineinfo)

add_library(jga_cuda STATIC ffi/cuda/cuda_handler.cc ffi/cuda/arch.cc ffi/cuda/quantize/quantize_handler.cc)
target_link_libraries(jga_cuda PUBLIC jga_core CUDA::cudart_static)

# Bit-identical to quantize.py: IEEE arithmetic, subnormals kept (no fast math, no FTZ).
file(GLOB JGA_QUANTIZE_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/quantize/*.cu)
add_library(jga_cuda_quantize STATIC ${JGA_QUANTIZE_SOURCES})
set_target_properties(jga_cuda_quantize PROPERTIES CUDA_ARCHITECTURES "${JAX_GEMM_AMAX_CUDA_ARCHS}")
target_compile_options(jga_cuda_quantize PRIVATE
                       $<$<COMPILE_LANGUAGE:CUDA>:${JGA_CUDA_FLAGS} -ftz=false -prec-div=true -prec-sqrt=true>)
target_link_libraries(jga_cuda_quantize PUBLIC jga_core CUDA::cudart_static)
target_link_libraries(jga_cuda PUBLIC jga_cuda_quantize)

if("90a" IN_LIST JAX_GEMM_AMAX_CUDA_ARCHS)
  file(GLOB JGA_SM90_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/sm90/*.cu)
  add_library(jga_cuda_sm90 STATIC ${JGA_SM90_SOURCES})
  set_target_properties(jga_cuda_sm90 PROPERTIES CUDA_ARCHITECTURES 90a)
  target_compile_options(jga_cuda_sm90 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${JGA_CUDA_FLAGS}>)
  target_link_libraries(jga_cuda_sm90 PUBLIC jga_core CUDA::cudart_static)
  target_link_libraries(jga_cuda PUBLIC jga_cuda_sm90)
else()
  message(FATAL_ERROR "JAX_GEMM_AMAX_CUDA_ARCHS must contain 90a (the Hopper kernels); got ${JAX_GEMM_AMAX_CUDA_ARCHS}")
endif()

# The few-row kernel (mma.sync, FP8 conversions: sm_89+ PTX): one library for every architecture of the build,
# one translation unit per A kind (skinny_launch.cuh) beside the host code.
file(GLOB JGA_SKINNY_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/skinny/*.cu)
add_library(jga_cuda_skinny STATIC ${JGA_SKINNY_SOURCES})
set_target_properties(jga_cuda_skinny PROPERTIES CUDA_ARCHITECTURES "${JAX_GEMM_AMAX_CUDA_ARCHS}")
target_compile_options(jga_cuda_skinny PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${JGA_CUDA_FLAGS}>)
target_link_libraries(jga_cuda_skinny PUBLIC jga_core CUDA::cudart_static)
target_link_libraries(jga_cuda PUBLIC jga_cuda_skinny)

if("100a" IN_LIST JAX_GEMM_AMAX_CUDA_ARCHS)
  include(${CMAKE_CURRENT_LIST_DIR}/sm100.cmake)
  target_link_libraries(jga_cuda PUBLIC jga_cuda_sm100)
  target_compile_definitions(jga_cuda PRIVATE JGA_HAVE_SM100=1)
endif()
