/* The check programs' one reporting form (scripts/verbs-abi.sh reads it):
 * each check prints "ok   what" or "FAIL what" on a line of its own, flushed
 * at once so that a crash or a hang still shows how far the program got; a
 * program exits non-zero when `failures` is not 0. */
#ifndef RSNIC_CHECK_H
#define RSNIC_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                       \
	do {                                   \
		if (cond) {                    \
			printf("ok   ");       \
		} else {                       \
			printf("FAIL ");       \
			failures++;            \
		}                              \
		printf(__VA_ARGS__);           \
		printf("\n");                  \
		fflush(stdout);                \
	} while (0)

#endif
