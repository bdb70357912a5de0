/* What bindgen reads: the system's own libibverbs and librdmacm headers
 * (Debian libibverbs-dev, librdmacm-dev). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
