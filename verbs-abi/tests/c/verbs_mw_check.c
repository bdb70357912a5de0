/*
 * Memory windows of librsnic_verbs.so seen from C (issue 40 item 6; IBA
 * 10.6.7, Linux rxe as the reference), as verbs_check.c: compiled against the
 * system's verbs.h, linked with -libverbs, run preloaded on a looped-back
 * net_ring0 port by scripts/verbs-abi.sh ("abi" part), two RC QPs of this
 * process connected to each other through the wire path.
 *
 * Checks: the device's memory-window capabilities; ibv_alloc_mw of type 1 and
 * 2 (and EINVAL for another type); ibv_bind_mw of a type 1 window (the R_Key
 * advanced with ibv_inc_rkey, the IBV_WC_BIND_MW completion, the peer's WRITE
 * and READ through the window, a WRITE past it and with the pre-bind R_Key a
 * remote access error) and verbs.h's own checks (EINVAL for a type 2 window,
 * for a range without a region, EPERM for a region of another PD); a region
 * with a window bound is not deregistered (EINVAL) until it is unbound;
 * IBV_WR_BIND_MW of a type 2 window through ibv_post_send, the peer's SEND
 * with Invalidate (IBV_WC_WITH_INV, invalidated_rkey) freeing it, a WRITE
 * after that refused; IBV_WR_LOCAL_INV; a bind to a region without
 * IBV_ACCESS_MW_BIND completing with IBV_WC_MW_BIND_ERR; the ibv_wr_* builders
 * (ibv_wr_bind_mw, ibv_wr_local_inv, ibv_wr_send_inv) and the extended CQ's
 * ibv_wc_read_invalidated_rkey; ibv_dealloc_mw. Exits 0 only if every check
 * passed; prints one line per check.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char buf[2][1 << 16] __attribute__((aligned(4096)));

#define RC_MW_OPS                                                                                        \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_BIND_MW | \
	 IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV)

static struct ibv_qp *rc_qp(struct ibv_cq *cq, uint64_t ops)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | (ops ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0),
		.send_ops_flags = ops,
	};
	return ibv_create_qp_ex(ctx, &a);
}

static int modify(struct ibv_qp *a, struct ibv_qp *b, uint32_t psn_a, uint32_t psn_b)
{
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = b->qp_num,
				 .rq_psn = psn_b, .max_dest_rd_atomic = 4, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	int rm = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .sq_psn = psn_a, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 4 };
	int sm = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		 IBV_QP_MAX_QP_RD_ATOMIC;
	return ibv_modify_qp(a, &r, rm) || ibv_modify_qp(a, &s, sm);
}

static int connect2(struct ibv_qp *a, struct ibv_qp *b)
{
	struct ibv_qp_attr i = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	int im = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	if (!a || !b || ibv_modify_qp(a, &i, im) || ibv_modify_qp(b, &i, im))
		return -1;
	return modify(a, b, 100, 200) || modify(b, a, 200, 100);
}

/* One completion within 5 s. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			return 0;
	}
}

static int post_rdma(struct ibv_qp *q, uint64_t id, enum ibv_wr_opcode op, void *local, uint32_t lkey, uint32_t len,
		     uint64_t remote, uint32_t rkey)
{
	struct ibv_sge sg = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr = { .rdma = { .remote_addr = remote, .rkey = rkey } } }, *bad;
	return ibv_post_send(q, &wr, &bad);
}

/* Two connected RC QPs on `cq` (A sends, B owns the windows). */
static void pair(struct ibv_cq *cq, uint64_t ops, struct ibv_qp **a, struct ibv_qp **b)
{
	*a = rc_qp(cq, ops);
	*b = rc_qp(cq, ops);
	if (connect2(*a, *b)) {
		printf("FAIL connect\n");
		exit(1);
	}
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1 || !(ctx = ibv_open_device(list[0]))) {
		printf("FAIL no device\n");
		return 1;
	}
	ibv_free_device_list(list);
	ibv_query_gid(ctx, 1, 0, &gid);
	pd = ibv_alloc_pd(ctx);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *ma = ibv_reg_mr(pd, buf[0], sizeof(buf[0]), all);
	struct ibv_mr *mb = ibv_reg_mr(pd, buf[1], sizeof(buf[1]), all | IBV_ACCESS_MW_BIND);
	struct ibv_cq *cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	CHECK(pd && pd2 && ma && mb && cq, "PDs, a region and a bindable region, a CQ");
	struct ibv_device_attr da;
	CHECK(!ibv_query_device(ctx, &da) && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
		      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) && da.max_mw > 0,
	      "query_device: MEM_WINDOW and MEM_WINDOW_TYPE_2B, max_mw %d", da.max_mw);
	struct ibv_wc wc;
	struct ibv_qp *a, *b;
	pair(cq, 0, &a, &b);

	/* ---- alloc */
	struct ibv_mw *w1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mw *w2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(w1 && w2 && w1->type == IBV_MW_TYPE_1 && w2->type == IBV_MW_TYPE_2 && w1->pd == pd &&
		      w1->context == ctx && w1->rkey != w2->rkey && w1->rkey != mb->rkey,
	      "alloc_mw type 1 and 2: distinct R_Keys");
	errno = 0;
	CHECK(!ibv_alloc_mw(pd, (enum ibv_mw_type)3) && errno == EINVAL, "alloc_mw of type 3: NULL/EINVAL");
	CHECK(ibv_dealloc_pd(pd2) == 0 && (pd2 = ibv_alloc_pd(ctx)), "(a PD without windows deallocates)");

	/* ---- ibv_bind_mw (type 1) */
	char *win = buf[1] + 4096;
	struct ibv_mw_bind mwb = { .wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
				   .bind_info = { .mr = mb, .addr = (uintptr_t)win, .length = 8192,
						  .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ } };
	uint32_t before = w1->rkey;
	int rc = ibv_bind_mw(b, w1, &mwb);
	CHECK(rc == 0 && w1->rkey == ibv_inc_rkey(before), "bind_mw type 1: 0, rkey %#x -> %#x (ibv_inc_rkey)", before,
	      w1->rkey);
	CHECK(wait_wc(cq, &wc) == 1 && wc.wr_id == 11 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW &&
		      wc.qp_num == b->qp_num,
	      "bind completion: IBV_WC_BIND_MW, success (status %d opcode %d)", wc.status, wc.opcode);
	for (int i = 0; i < 8192; i++)
		buf[0][i] = (char)(i * 13 + 7);
	rc = post_rdma(a, 12, IBV_WR_RDMA_WRITE, buf[0], ma->lkey, 8192, (uintptr_t)win, w1->rkey);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && !memcmp(win, buf[0], 8192),
	      "the peer's WRITE of 8 KiB through the window lands in the region");
	memset(buf[0] + 16384, 0, 4096);
	rc = post_rdma(a, 13, IBV_WR_RDMA_READ, buf[0] + 16384, ma->lkey, 4096, (uintptr_t)win + 100, w1->rkey);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ &&
		      !memcmp(buf[0] + 16384, win + 100, 4096),
	      "the peer's READ through the window");
	errno = 0;
	CHECK(ibv_dereg_mr(mb) == EINVAL, "dereg_mr of a region with a window bound: EINVAL");
	struct ibv_mw_bind bad = mwb;
	CHECK(ibv_bind_mw(b, w2, &bad) == EINVAL, "bind_mw of a type 2 window: EINVAL (verbs.h)");
	bad.bind_info.mr = NULL;
	CHECK(ibv_bind_mw(b, w1, &bad) == EINVAL, "bind_mw with a range and no region: EINVAL");
	struct ibv_mr *other = ibv_reg_mr(pd2, buf[0] + 32768, 4096, all | IBV_ACCESS_MW_BIND);
	bad.bind_info.mr = other;
	bad.bind_info.addr = (uintptr_t)buf[0] + 32768;
	bad.bind_info.length = 64;
	CHECK(other && ibv_bind_mw(b, w1, &bad) == EPERM, "bind_mw to a region of another PD: EPERM");
	bad = mwb;
	bad.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
	CHECK(ibv_bind_mw(b, w1, &bad) == EINVAL, "bind_mw zero-based: EINVAL");
	/* A WRITE past the window's end, then one with the pre-bind key: remote
	 * access errors (each moves A to ERR: a fresh pair for the second). */
	rc = post_rdma(a, 14, IBV_WR_RDMA_WRITE, buf[0], ma->lkey, 16, (uintptr_t)win + 8192 - 8, w1->rkey);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.wr_id == 14 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE past the window's end: IBV_WC_REM_ACCESS_ERR (status %d)", wc.status);
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	pair(cq, RC_MW_OPS, &a, &b);
	rc = post_rdma(a, 15, IBV_WR_RDMA_WRITE, buf[0], ma->lkey, 16, (uintptr_t)win, before);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.wr_id == 15 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE with the R_Key from before the bind: IBV_WC_REM_ACCESS_ERR (status %d)", wc.status);
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	pair(cq, RC_MW_OPS, &a, &b);
	/* Unbind (length 0): the region may be deregistered then. */
	struct ibv_mw_bind unbind = { .wr_id = 16, .send_flags = IBV_SEND_SIGNALED, .bind_info = { 0 } };
	CHECK(ibv_bind_mw(b, w1, &unbind) == 0 && wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
	      "bind_mw of length 0 unbinds");

	/* ---- IBV_WR_BIND_MW of a type 2 window, SEND with Invalidate */
	uint32_t k2 = ibv_inc_rkey(w2->rkey);
	struct ibv_send_wr bw = { .wr_id = 21, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED,
				  .bind_mw = { .mw = w2, .rkey = k2,
					       .bind_info = { .mr = mb, .addr = (uintptr_t)win, .length = 4096,
							      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } } },
			   *badwr;
	rc = ibv_post_send(b, &bw, &badwr);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.wr_id == 21 && wc.status == IBV_WC_SUCCESS &&
		      wc.opcode == IBV_WC_BIND_MW,
	      "post_send IBV_WR_BIND_MW (type 2): success");
	w2->rkey = k2;
	rc = post_rdma(a, 22, IBV_WR_RDMA_WRITE, buf[0], ma->lkey, 4096, (uintptr_t)win, k2);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "WRITE through the type 2 window");
	struct ibv_sge rs = { .addr = (uintptr_t)buf[1], .length = 256, .lkey = mb->lkey };
	struct ibv_recv_wr rw = { .wr_id = 23, .sg_list = &rs, .num_sge = 1 }, *badr;
	struct ibv_sge ss = { .addr = (uintptr_t)buf[0], .length = 100, .lkey = ma->lkey };
	struct ibv_send_wr sw = { .wr_id = 24, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				  .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = k2 };
	rc = ibv_post_recv(b, &rw, &badr) || ibv_post_send(a, &sw, &badwr);
	struct ibv_wc got[2];
	int k = rc == 0 ? wait_wc(cq, &got[0]) + wait_wc(cq, &got[1]) : 0;
	struct ibv_wc *r = got[0].wr_id == 23 ? &got[0] : &got[1], *s = got[0].wr_id == 23 ? &got[1] : &got[0];
	CHECK(k == 2 && r->wr_id == 23 && r->status == IBV_WC_SUCCESS && r->opcode == IBV_WC_RECV &&
		      (r->wc_flags & IBV_WC_WITH_INV) && !(r->wc_flags & IBV_WC_WITH_IMM) && r->invalidated_rkey == k2 &&
		      r->byte_len == 100,
	      "SEND_WITH_INV: receive has IBV_WC_WITH_INV, invalidated_rkey %#x (want %#x)", r->invalidated_rkey, k2);
	CHECK(k == 2 && s->wr_id == 24 && s->status == IBV_WC_SUCCESS && s->opcode == IBV_WC_SEND,
	      "SEND_WITH_INV: the sender's completion is IBV_WC_SEND");
	rc = post_rdma(a, 25, IBV_WR_RDMA_WRITE, buf[0], ma->lkey, 16, (uintptr_t)win, k2);
	CHECK(rc == 0 && wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE through the invalidated window: IBV_WC_REM_ACCESS_ERR");
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* ---- the ibv_wr_* builders, LOCAL_INV, an extended CQ */
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM };
	struct ibv_cq_ex *cx = ibv_create_cq_ex(ctx, &ca);
	struct ibv_cq *xcq = cx ? ibv_cq_ex_to_cq(cx) : NULL;
	CHECK(xcq != NULL, "an extended CQ");
	pair(xcq, RC_MW_OPS, &a, &b);
	struct ibv_qp_ex *xb = ibv_qp_to_qp_ex(b), *xa = ibv_qp_to_qp_ex(a);
	CHECK(xa && xb && xb->wr_bind_mw && xb->wr_local_inv && xa->wr_send_inv,
	      "send_ops BIND_MW, LOCAL_INV, SEND_WITH_INV: their builders set");
	struct ibv_mw_bind_info bi = { .mr = mb, .addr = (uintptr_t)win, .length = 512,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	uint32_t k3 = ibv_inc_rkey(w2->rkey);
	ibv_wr_start(xb);
	xb->wr_id = 31;
	xb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(xb, w2, k3, &bi);
	xb->wr_id = 32;
	ibv_wr_local_inv(xb, k3);
	rc = ibv_wr_complete(xb);
	struct ibv_poll_cq_attr pa = { 0 };
	int seen = 0, order_ok = 1;
	for (int tries = 0; seen < 2 && tries < 5000000; tries++) {
		if (ibv_start_poll(cx, &pa))
			continue;
		do {
			uint64_t want = 31 + seen;
			enum ibv_wc_opcode op = ibv_wc_read_opcode(cx);
			if (cx->wr_id != want || cx->status != IBV_WC_SUCCESS ||
			    op != (seen == 0 ? IBV_WC_BIND_MW : IBV_WC_LOCAL_INV))
				order_ok = 0;
			seen++;
		} while (!ibv_next_poll(cx));
		ibv_end_poll(cx);
	}
	CHECK(rc == 0 && seen == 2 && order_ok, "wr_bind_mw then wr_local_inv: BIND_MW, LOCAL_INV completions in order");
	w2->rkey = k3;
	/* A LOCAL_INV of the window now free: IBV_WC_LOC_QP_OP_ERR, B to ERR. */
	struct ibv_send_wr li = { .wr_id = 33, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
				  .invalidate_rkey = k3 };
	rc = ibv_post_send(b, &li, &badwr);
	struct ibv_wc xw;
	CHECK(rc == 0 && wait_wc(xcq, &xw) == 1 && xw.wr_id == 33 && xw.status == IBV_WC_LOC_QP_OP_ERR &&
		      xw.opcode == IBV_WC_LOCAL_INV,
	      "LOCAL_INV of a free window: IBV_WC_LOC_QP_OP_ERR (status %d)", xw.status);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	pair(xcq, RC_MW_OPS, &a, &b);
	xb = ibv_qp_to_qp_ex(b);
	xa = ibv_qp_to_qp_ex(a);
	uint32_t k4 = ibv_inc_rkey(k3);
	ibv_wr_start(xb);
	xb->wr_id = 41;
	xb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(xb, w2, k4, &bi);
	rc = ibv_wr_complete(xb);
	CHECK(rc == 0 && wait_wc(xcq, &xw) == 1 && xw.status == IBV_WC_SUCCESS, "wr_bind_mw of the type 2 window again");
	w2->rkey = k4;
	ibv_post_recv(b, &rw, &badr);
	ibv_wr_start(xa);
	xa->wr_id = 42;
	xa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(xa, k4);
	ibv_wr_set_sge(xa, ma->lkey, (uintptr_t)buf[0], 8);
	rc = ibv_wr_complete(xa);
	uint32_t inv = 0, flags = 0;
	int recv_seen = 0;
	for (int tries = 0; recv_seen < 2 && tries < 5000000; tries++) {
		if (ibv_start_poll(cx, &pa))
			continue;
		do {
			if (cx->wr_id == 23 && ibv_wc_read_opcode(cx) == IBV_WC_RECV) {
				inv = ibv_wc_read_invalidated_rkey(cx);
				flags = ibv_wc_read_wc_flags(cx);
			}
			recv_seen++;
		} while (!ibv_next_poll(cx));
		ibv_end_poll(cx);
	}
	CHECK(rc == 0 && recv_seen == 2 && inv == k4 && (flags & IBV_WC_WITH_INV),
	      "wr_send_inv: ibv_wc_read_invalidated_rkey %#x (want %#x), IBV_WC_WITH_INV", inv, k4);

	/* ---- a bind to a region without MW_BIND: IBV_WC_MW_BIND_ERR, QP to ERR */
	struct ibv_mw_bind nob = { .wr_id = 51, .send_flags = IBV_SEND_SIGNALED,
				   .bind_info = { .mr = ma, .addr = (uintptr_t)buf[0], .length = 64,
						  .mw_access_flags = IBV_ACCESS_REMOTE_READ } };
	before = w1->rkey;
	rc = ibv_bind_mw(b, w1, &nob);
	CHECK(rc == 0 && wait_wc(xcq, &xw) == 1 && xw.wr_id == 51 && xw.status == IBV_WC_MW_BIND_ERR,
	      "bind_mw to a region without MW_BIND: IBV_WC_MW_BIND_ERR (status %d)", xw.status);
	w1->rkey = before;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(!ibv_query_qp(b, &qa, IBV_QP_STATE, &qi) && qa.qp_state == IBV_QPS_ERR, "the QP is in ERR after it");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* ---- teardown: windows first, then the region (a PD with a window is busy) */
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with windows and regions: EBUSY");
	CHECK(ibv_dealloc_mw(w1) == 0 && ibv_dealloc_mw(w2) == 0, "dealloc_mw of both windows");
	CHECK(ibv_dereg_mr(mb) == 0, "dereg_mr of the region once no window is bound");
	ibv_dereg_mr(other);
	ibv_dereg_mr(ma);
	ibv_destroy_cq(xcq);
	ibv_destroy_cq(cq);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(pd2) == 0, "the PDs deallocate");
	ibv_close_device(ctx);
	printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
