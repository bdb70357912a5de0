/* What bindgen reads: the system's own libibverbs headers (Debian libibverbs-dev). */
#include <infiniband/verbs.h>
