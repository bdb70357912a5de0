/*
 * Thin, non-inline wrappers around DPDK's static inline functions, so that
 * Rust can call them. Every function here is a one-line forward; the
 * semantics are exactly those of the wrapped DPDK function.
 */
#ifndef RSNIC_DPDK_SHIM_H
#define RSNIC_DPDK_SHIM_H

#include <stdint.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_ethdev.h>

uint16_t shim_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
                               struct rte_mbuf **rx_pkts, uint16_t nb_pkts);
uint16_t shim_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
                               struct rte_mbuf **tx_pkts, uint16_t nb_pkts);

struct rte_mbuf *shim_rte_pktmbuf_alloc(struct rte_mempool *mp);
int shim_rte_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs,
                                unsigned int count);
void shim_rte_pktmbuf_free(struct rte_mbuf *m);
void shim_rte_pktmbuf_reset(struct rte_mbuf *m);
int shim_rte_mempool_get_bulk(struct rte_mempool *mp, void **objs, unsigned int n);
void shim_rte_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned int n);
char *shim_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
char *shim_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
int shim_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
uint16_t shim_rte_pktmbuf_tailroom(const struct rte_mbuf *m);
int shim_rte_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
void shim_rte_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr,
                                    rte_iova_t buf_iova, uint16_t buf_len,
                                    struct rte_mbuf_ext_shared_info *shinfo);
struct rte_mbuf_ext_shared_info *shim_rte_pktmbuf_ext_shinfo_init_helper(
    void *buf_addr, uint16_t *buf_len, rte_mbuf_extbuf_free_callback_t free_cb,
    void *fcb_opaque);
uint16_t shim_rte_mbuf_ext_refcnt_read(const struct rte_mbuf_ext_shared_info *shinfo);
void shim_rte_mbuf_ext_refcnt_set(struct rte_mbuf_ext_shared_info *shinfo,
                                  uint16_t new_value);
uint16_t shim_rte_mbuf_ext_refcnt_update(struct rte_mbuf_ext_shared_info *shinfo,
                                         int16_t value);

unsigned int shim_rte_ring_enqueue_burst(struct rte_ring *r, void *const *obj_table,
                                         unsigned int n, unsigned int *free_space);
unsigned int shim_rte_ring_dequeue_burst(struct rte_ring *r, void **obj_table,
                                         unsigned int n, unsigned int *available);
unsigned int shim_rte_ring_count(const struct rte_ring *r);

unsigned int shim_rte_lcore_id(void);
int shim_rte_errno(void);
uint64_t shim_rte_rdtsc(void);

#endif
