# Build options (DESIGN.md §5): PD_CUDA, PD_SANITIZE, PD_WERROR, and the warning set every
# target gets. Options apply to C only; CUDA flags are set where kernels/ is built.
include_guard(GLOBAL)

set(PD_CUDA "AUTO" CACHE STRING "Build kernels/ with nvcc: AUTO (when nvcc is found), ON, OFF")
set_property(CACHE PD_CUDA PROPERTY STRINGS AUTO ON OFF)
set(PD_SANITIZE "" CACHE STRING "Sanitizers for host code, e.g. address,undefined")
option(PD_WERROR "Treat warnings as errors" OFF)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
    set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

set(CMAKE_C_STANDARD 11)
set(CMAKE_C_STANDARD_REQUIRED ON)
set(CMAKE_C_EXTENSIONS OFF)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
add_compile_definitions(_GNU_SOURCE)

set(PD_C_WARNINGS -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2
    -Wno-unused-parameter)
if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
    list(APPEND PD_C_WARNINGS -Wno-format-truncation) # gcc only; clang (fuzz build) lacks it
endif()
if(PD_WERROR)
    list(APPEND PD_C_WARNINGS -Werror)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:C>:${PD_C_WARNINGS}>")

if(PD_SANITIZE)
    set(_pd_san -fsanitize=${PD_SANITIZE} -fno-omit-frame-pointer)
    if(PD_SANITIZE MATCHES "undefined")
        list(APPEND _pd_san -fno-sanitize-recover=undefined)
    endif()
    add_compile_options("$<$<COMPILE_LANGUAGE:C>:${_pd_san}>")
    add_link_options(${_pd_san})
endif()

# PD_CUDA: kernels/ compiles whenever nvcc is here, even on machines with no GPU to run it.
set(PD_CUDA_ENABLED OFF)
if(NOT PD_CUDA STREQUAL "OFF")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
            set(CMAKE_CUDA_ARCHITECTURES 90a)
        endif()
        enable_language(CUDA)
        set(PD_CUDA_ENABLED ON)
    elseif(PD_CUDA STREQUAL "ON")
        message(FATAL_ERROR "PD_CUDA=ON but no CUDA compiler (nvcc) was found")
    endif()
endif()
message(STATUS "pdserve: CUDA ${PD_CUDA_ENABLED}, sanitize '${PD_SANITIZE}', werror ${PD_WERROR}")

# PD_FUZZ: libFuzzer targets (tests/fuzz/). They need clang's -fsanitize=fuzzer (Debian:
# clang + libclang-rt-14-dev); AUTO builds them when that links, else skips them. When on, every
# C file also gets -fsanitize=fuzzer-no-link so the fuzzers see coverage of the product code.
set(PD_FUZZ "AUTO" CACHE STRING "Build libFuzzer targets: AUTO (when clang has libFuzzer), ON, OFF")
set_property(CACHE PD_FUZZ PROPERTY STRINGS AUTO ON OFF)
set(PD_FUZZ_ENABLED OFF)
if(NOT PD_FUZZ STREQUAL "OFF")
    if(CMAKE_C_COMPILER_ID STREQUAL "Clang")
        include(CheckCSourceCompiles)
        set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
        set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=fuzzer)
        check_c_source_compiles("#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }"
            PD_HAVE_LIBFUZZER)
        unset(CMAKE_REQUIRED_FLAGS)
        unset(CMAKE_REQUIRED_LINK_OPTIONS)
    endif()
    if(PD_HAVE_LIBFUZZER)
        set(PD_FUZZ_ENABLED ON)
        add_compile_options("$<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link>")
    elseif(PD_FUZZ STREQUAL "ON")
        message(FATAL_ERROR "PD_FUZZ=ON but ${CMAKE_C_COMPILER} cannot link -fsanitize=fuzzer "
            "(needs clang and libclang-rt-14-dev)")
    else()
        message(STATUS "pdserve: fuzz targets skipped (${CMAKE_C_COMPILER_ID} compiler has no "
            "libFuzzer; configure with CC=clang for them)")
    endif()
endif()
message(STATUS "pdserve: fuzz ${PD_FUZZ_ENABLED}")
