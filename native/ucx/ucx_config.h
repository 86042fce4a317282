/* What UCX's configure would have put in config.h for Debian's libucx0 1.13.1 build
 * (its debian/rules: --enable-mt --disable-logging, no --enable-stats,
 * --enable-debug-data or --with-cache-line-size), for the few macros UCX's internal
 * headers read (src/ucs/configure.m4, configure.ac). None but ENABLE_STATS and
 * HAVE_CACHE_LINE_SIZE changes a structure's layout; both stay unset, as in Debian's
 * build (ucx_info -c lists no UCX_STATS_* variable). Passed with -include.
 */
#ifndef HPVC_UCX_CONFIG_H
#define HPVC_UCX_CONFIG_H
#define ENABLE_DEBUG_DATA 0
#define ENABLE_MT 1
#define ENABLE_BUILTIN_MEMCPY 0
#define UCS_MAX_LOG_LEVEL UCS_LOG_LEVEL_DEBUG
#define HAVE___CLEAR_CACHE 1
#define HAVE_ATTRIBUTE_NOOPTIMIZE 1
#define UCX_SHARED_LIB 1
#endif
