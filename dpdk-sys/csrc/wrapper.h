/* Headers that bindgen reads. Keep this list to what the safe layer uses. */
#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_launch.h>
#include <rte_cycles.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_ring.h>
#include <rte_ethdev.h>
#include <rte_bus_vdev.h>
#include <rte_eth_ring.h>
#include <rte_pcapng.h>
#include "shim.h"
