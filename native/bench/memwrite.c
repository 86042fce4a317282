/* A memory-writing load for live-migration benchmarks (issue 27).
 *
 *   memwrite MIB SECONDS
 *
 * Holds MIB MiB and writes one word into every 4 KiB page of it, round after
 * round, for SECONDS of its own clock, so that a migration keeps finding
 * dirty pages. Each round first checks that every page still holds what the
 * round before wrote (a page a migration lost or sent stale shows there).
 * Prints "memwrite done: R rounds, W wrong" at the end and exits 1 when a
 * page was wrong. Built by `hpvc bench migrate` (hpvc.bench.migrate.runner)
 * and tests/integration/test_migrate.py, and copied into the guests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: memwrite MIB SECONDS\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    long secs = atol(argv[2]);
    volatile unsigned long *mem = malloc(bytes);
    if (mem == NULL || bytes == 0) {
        fprintf(stderr, "memwrite: cannot hold %s MiB\n", argv[1]);
        return 1;
    }
    size_t step = 4096 / sizeof(unsigned long), words = bytes / sizeof(unsigned long);
    time_t end = time(NULL) + secs;
    unsigned long rounds = 0, wrong = 0;
    while (time(NULL) < end) {
        for (size_t i = 0; i < words; i += step) {
            if (rounds > 0 && mem[i] != rounds - 1 + i) wrong++;
            mem[i] = rounds + i;
        }
        rounds++;
    }
    printf("memwrite done: %lu rounds, %lu wrong\n", rounds, wrong);
    return wrong != 0;
}
