# Third-party libraries, all from Debian packages (DESIGN.md §6; scripts/setup.sh installs them).
# Each is an imported target; modules link only what they use.
include_guard(GLOBAL)

find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
find_library(PD_LIBM m REQUIRED)

find_package(Python3 COMPONENTS Interpreter)
# The cpu backend's large matrix products (common/backend_cpu.c).
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# Tokenizer: pre-tokenizer regexes with Unicode properties (PCRE2), NFC & co. (utf8proc).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# Event loop of the daemons and the router (DESIGN.md §2a).
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
# The router's upstream HTTP client: curl's multi interface runs on the router's libuv loop.
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
# HTTP server of the daemons and the router: h2o, libuv build.
pkg_check_modules(H2O REQUIRED IMPORTED_TARGET libh2o)
