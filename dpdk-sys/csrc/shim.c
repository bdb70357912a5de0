#include "shim.h"

#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_cycles.h>

uint16_t shim_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
                               struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t shim_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
                               struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

struct rte_mbuf *shim_rte_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int shim_rte_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs,
                                unsigned int count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void shim_rte_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void shim_rte_pktmbuf_reset(struct rte_mbuf *m)
{
	rte_pktmbuf_reset(m);
}

int shim_rte_mempool_get_bulk(struct rte_mempool *mp, void **objs, unsigned int n)
{
	return rte_mempool_get_bulk(mp, objs, n);
}

void shim_rte_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned int n)
{
	rte_mempool_put_bulk(mp, objs, n);
}

char *shim_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

char *shim_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_adj(m, len);
}

int shim_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

uint16_t shim_rte_pktmbuf_tailroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_tailroom(m);
}

int shim_rte_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail)
{
	return rte_pktmbuf_chain(head, tail);
}

void shim_rte_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr,
                                    rte_iova_t buf_iova, uint16_t buf_len,
                                    struct rte_mbuf_ext_shared_info *shinfo)
{
	rte_pktmbuf_attach_extbuf(m, buf_addr, buf_iova, buf_len, shinfo);
}

struct rte_mbuf_ext_shared_info *shim_rte_pktmbuf_ext_shinfo_init_helper(
    void *buf_addr, uint16_t *buf_len, rte_mbuf_extbuf_free_callback_t free_cb,
    void *fcb_opaque)
{
	return rte_pktmbuf_ext_shinfo_init_helper(buf_addr, buf_len, free_cb, fcb_opaque);
}

uint16_t shim_rte_mbuf_ext_refcnt_read(const struct rte_mbuf_ext_shared_info *shinfo)
{
	return rte_mbuf_ext_refcnt_read(shinfo);
}

void shim_rte_mbuf_ext_refcnt_set(struct rte_mbuf_ext_shared_info *shinfo,
                                  uint16_t new_value)
{
	rte_mbuf_ext_refcnt_set(shinfo, new_value);
}

uint16_t shim_rte_mbuf_ext_refcnt_update(struct rte_mbuf_ext_shared_info *shinfo,
                                         int16_t value)
{
	return rte_mbuf_ext_refcnt_update(shinfo, value);
}

unsigned int shim_rte_ring_enqueue_burst(struct rte_ring *r, void *const *obj_table,
                                         unsigned int n, unsigned int *free_space)
{
	return rte_ring_enqueue_burst(r, obj_table, n, free_space);
}

unsigned int shim_rte_ring_dequeue_burst(struct rte_ring *r, void **obj_table,
                                         unsigned int n, unsigned int *available)
{
	return rte_ring_dequeue_burst(r, obj_table, n, available);
}

unsigned int shim_rte_ring_count(const struct rte_ring *r)
{
	return rte_ring_count(r);
}

unsigned int shim_rte_lcore_id(void)
{
	return rte_lcore_id();
}

int shim_rte_errno(void)
{
	return rte_errno;
}

uint64_t shim_rte_rdtsc(void)
{
	return rte_rdtsc();
}
