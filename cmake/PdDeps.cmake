# Third-party libraries, all from Debian packages (DESIGN.md §6; scripts/setup.sh installs them).
# Each is an imported target; modules link only what they use.
include_guard(GLOBAL)

find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
find_library(PD_LIBM m REQUIRED)

# The Python tests run with .venv-tools/bin/python when scripts/setup.sh made it: a venv over
# Debian's python3 (--system-site-packages) that adds the pinned test packages (safetensors,
# transformers, openai, ...). Another python3 first on PATH (pyenv, conda) would lack them and the
# tests would skip. -DPython3_EXECUTABLE=... still chooses.
if(NOT DEFINED CACHE{Python3_EXECUTABLE} AND EXISTS ${PROJECT_SOURCE_DIR}/.venv-tools/bin/python)
    set(Python3_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv-tools/bin/python)
endif()
find_package(Python3 COMPONENTS Interpreter)
# The cpu backend's large matrix products (model/cpu/backend_cpu.c).
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# Images of vision requests (model/vision/): PNG through libpng, JPEG through libjpeg-turbo (the
# JPEG library Pillow's wheels carry, so decoded pixels match transformers' PIL pipeline).
pkg_check_modules(LIBPNG REQUIRED IMPORTED_TARGET libpng)
pkg_check_modules(LIBJPEG REQUIRED IMPORTED_TARGET libjpeg)
# Tokenizer: pre-tokenizer regexes with Unicode properties (PCRE2), NFC & co. (utf8proc).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)

# Disaggregation planes (DESIGN.md §1): UCX for KV pages, gRPC core + protobuf-c for bootstrap,
# libuv for the loop both are driven from, libibverbs to check --disaggregation-ib-device.
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
pkg_check_modules(GRPC REQUIRED IMPORTED_TARGET grpc)
pkg_check_modules(PROTOBUF_C REQUIRED IMPORTED_TARGET libprotobuf-c)
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
pkg_check_modules(IBVERBS REQUIRED IMPORTED_TARGET libibverbs)
find_program(PD_PROTOC_C protoc-c REQUIRED)
# HTTP user plane: h2o (libuv build; pkg-config `libh2o`, not `libh2o-evloop`) on libuv loops.
pkg_check_modules(H2O REQUIRED IMPORTED_TARGET libh2o)
# TLS on the HTTP listeners (h2o takes an OpenSSL SSL_CTX; common/base/tls.c builds it). h2o is
# built against it anyway; named here because pdbase calls OpenSSL itself.
pkg_check_modules(OPENSSL REQUIRED IMPORTED_TARGET openssl)
# pdserve-router's upstream client (curl's multi interface on the router's libuv loop); the
# HTTP server's integration test drives the server with it too.
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
